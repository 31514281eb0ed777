//! `salt-keysync recover --from-peers`: rebuilds a lost or corrupt state
//! folder from the peers, without ever overriding their decisions.
//!
//! Every decision the reachable peers hold is fetched (the highest version
//! per id wins across peers), the unusable store is moved aside, and a new
//! store is made holding those decisions in its apply journal, not yet as
//! held decisions. The next `run` then applies them to the folders first and
//! treats whatever else the folders hold as a first start: bootstrap versions
//! that rank below every live decision, so this master's files never undo
//! what the cluster decided. A new marker ties the folders to the new store.
//! The store notes when it started afresh, after every peer's clock: what
//! names this master from before is its own past, taken back (`remote.rs`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use keysync_proto::v1;
use keysync_proto::PROTOCOL_VERSION;

use crate::config::{Config, Peer};
use crate::core::digest::N_BUCKETS;
use crate::core::{Decision, MinionId};
use crate::disk::state_guard;
use crate::disk::store::{Store, StoreError};
use crate::net::rpc::MAX_FETCH_IDS;
use crate::net::wire::decision_from_wire;

const PEER_TIMEOUT: Duration = Duration::from_secs(60);

/// What a recovery did, for the operator.
#[derive(Debug)]
pub struct Recovered {
    pub n_decisions: usize,
    /// Peers that answered, with how many decisions each sent.
    pub answered: Vec<(String, usize)>,
    /// Peers that did not, with the error.
    pub unreachable: Vec<(String, String)>,
    /// Where the unusable store was moved, if there was one.
    pub moved_aside: Option<PathBuf>,
    pub store_id: String,
    /// When the new store started afresh (wall-clock ms): after this
    /// master's clock and every answering peer's, so after everything this
    /// master decided before (see [`afresh_ms`]).
    pub afresh_ms: u64,
}

/// Rebuilds the state of `config` from its peers. `force`: also when the
/// current state looks healthy (it was restored from an old backup).
pub async fn recover_from_peers(config: &Config, force: bool) -> Result<Recovered> {
    let state_file = config.state_dir.join("state.redb");
    let pki = crate::setup::open_pki(config, true)?;
    // Not while an agent serves these folders: its marker would be rewritten
    // under it (and the real agent refuse to start afterwards).
    let _serving = pki.lock_serving().map_err(anyhow::Error::msg)?;
    if state_file.exists() {
        match Store::open(&config.state_dir, &config.node) {
            Err(StoreError::Db { cause, .. }) if matches!(*cause, redb::Error::DatabaseAlreadyOpen) => {
                bail!("{} is in use: stop the agent before recovering", state_file.display())
            }
            Ok(store) if !force && state_guard::check(&pki, &store, &config.state_dir).is_ok() => bail!(
                "the state in {} matches {}; nothing is lost. If it was restored from an old backup, \
                 rebuild it anyway with --force",
                state_file.display(),
                pki.marker_path().display()
            ),
            _ => {}
        }
    }
    if config.peers.is_empty() {
        bail!("no [[peer]] in the config: there is nothing to recover from");
    }
    let tls = crate::setup::load_tls(config)?;
    // The ids this master's folders decide (accepted, rejected): asked for
    // by name too, so that the peers' deletes of them come (a Diff answer
    // carries a bounded number of deletes; their Fetch answers any id).
    let listed = pki.list().with_context(|| format!("cannot list the key folders in {}", config.pki_dir.display()))?;
    let local: Vec<String> = listed
        .into_iter()
        .filter(|(folder, name)| {
            matches!(folder, crate::core::Folder::Accepted | crate::core::Folder::Rejected)
                && MinionId::parse(name).is_ok()
        })
        .map(|(_, name)| name)
        .collect();
    let mut newest: HashMap<MinionId, Decision> = HashMap::new();
    let mut answered = Vec::new();
    let mut unreachable = Vec::new();
    let wall_ms = crate::node::wall_ms();
    let mut clocks_ms = vec![wall_ms];
    for peer in &config.peers {
        match tokio::time::timeout(PEER_TIMEOUT, fetch_all(config, peer, &tls, &local)).await {
            Ok(Ok((decisions, clock_ms))) => {
                answered.push((peer.name.to_string(), decisions.len()));
                clocks_ms.extend(clock_ms);
                for decision in decisions {
                    let newer = newest.get(&decision.id).is_none_or(|held| held.version < decision.version);
                    if newer {
                        newest.insert(decision.id.clone(), decision);
                    }
                }
            }
            Ok(Err(e)) => unreachable
                .push((peer.name.to_string(), crate::net::cause::describe(e.as_ref(), &peer.name, &config.node))),
            Err(_) => unreachable.push((peer.name.to_string(), format!("no answer within {PEER_TIMEOUT:?}"))),
        }
    }
    if answered.is_empty() {
        let why: Vec<String> = unreachable.iter().map(|(name, e)| format!("{name}: {e}")).collect();
        bail!("no peer answered, the state is left as it was ({})", why.join("; "));
    }

    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("cannot create state_dir {}", config.state_dir.display()))?;
    let moved_aside = if state_file.exists() {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let aside = config.state_dir.join(format!("state.redb.lost-{secs}"));
        std::fs::rename(&state_file, &aside)
            .with_context(|| format!("cannot move {} aside to {}", state_file.display(), aside.display()))?;
        Some(aside)
    } else {
        None
    };
    let store = Store::open(&config.state_dir, &config.node)?;
    let decisions: Vec<Decision> = newest.into_values().collect();
    // Journalled, not recorded: the store stays uninitialized, so the next
    // start applies these first and treats local files as a first start.
    store.journal(&decisions)?;
    let skew_ms = u64::try_from(config.timings.max_clock_skew.as_millis()).unwrap_or(u64::MAX);
    let afresh_ms = afresh_ms(&clocks_ms, &decisions, wall_ms.saturating_add(skew_ms));
    store.set_afresh(afresh_ms << crate::core::version::LOGICAL_BITS)?;
    state_guard::write_marker(&pki, store.id(), &config.node)?;
    Ok(Recovered {
        n_decisions: decisions.len(),
        answered,
        unreachable,
        moved_aside,
        store_id: store.id().to_string(),
        afresh_ms,
    })
}

/// When the recovered store starts afresh: just after this master's wall
/// clock, every answering peer's hybrid clock (`clocks_ms`) and every
/// decision fetched. A peer's hybrid clock is past every version it holds,
/// so whatever this master decided before and a peer kept (even stamped
/// ahead by a clock that ran ahead) is older: its own forgotten past, which
/// the agent takes back when a peer offers it (among them one its folders
/// had overtaken when it stopped, which the start leaves to a claim of
/// these folders). What names this master and is
/// newer, it never made: refused. (Peers of an earlier release tell no
/// clock: the versions fetched from them stand in.) At most just past
/// `limit`, this master's wall clock and `max_clock_skew`: the agent's
/// clock moves to the start afresh, and a clock further ahead would have
/// its decisions refused.
fn afresh_ms(clocks_ms: &[u64], decisions: &[Decision], limit: u64) -> u64 {
    let fetched = decisions.iter().map(|d| d.version.millis());
    clocks_ms.iter().copied().chain(fetched).max().unwrap_or(0).min(limit).saturating_add(1)
}

/// Every decision `peer` holds: its summaries for all buckets (an empty
/// store's digests differ from every non-empty bucket), then the decisions;
/// and whatever it holds for the `local` ids (its deletes of them).
/// Also returns the peer's hybrid clock (ms), if it tells it.
async fn fetch_all(
    config: &Config,
    peer: &Peer,
    tls: &keysync_server::TlsSetup,
    local: &[String],
) -> Result<(Vec<Decision>, Option<u64>)> {
    let mut client = keysync_server::connect(
        &peer.address,
        &peer.name,
        tls,
        crate::net::peers::MAX_MESSAGE_BYTES,
        Duration::from_secs(10),
    )
    .await?;
    let hello = client
        .hello(v1::HelloRequest { node: config.node.clone(), protocol_version: PROTOCOL_VERSION, ..Default::default() })
        .await?
        .into_inner();
    if hello.node != peer.name.as_str() {
        bail!("peer answered Hello as {:?}", hello.node);
    }
    let clock_ms = crate::net::wire::clock_from_wire(hello.clock).map(|clock| clock.stamp_ms);
    let request = v1::DiffRequest { n_buckets: N_BUCKETS as u32, digests: vec![0; N_BUCKETS], ..Default::default() };
    let mut stream = client.diff(request).await?.into_inner();
    let mut ids = Vec::new();
    while let Some(chunk) = stream.message().await? {
        ids.extend(chunk.entries.into_iter().map(|summary| summary.minion));
    }
    // This master's folders may still hold keys deleted elsewhere while it
    // was down; the peer's Diff answer names no delete to a store this
    // empty: its deletes of them are asked for by name.
    ids.extend(local.iter().cloned());
    ids.sort_unstable();
    ids.dedup();
    let mut decisions = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(MAX_FETCH_IDS) {
        let mut stream =
            client.fetch(v1::FetchRequest { minions: chunk.to_vec(), ..Default::default() }).await?.into_inner();
        while let Some(batch) = stream.message().await? {
            for msg in batch.decisions {
                // The same checks as any peer's decision: a bad one is skipped and named.
                match decision_from_wire(msg) {
                    Ok(decision) => decisions.push(decision),
                    Err(e) => tracing::warn!(peer = %peer.name, error = %e, "refused a decision"),
                }
            }
        }
    }
    Ok((decisions, clock_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Context, Relays, Verdict, Version};

    /// Past this master's wall clock, every peer's clock and every decision
    /// fetched, by a millisecond; at most just past `limit`.
    #[test]
    fn the_start_afresh_is_after_every_clock_and_decision_within_the_limit() {
        let fetched = |ms: u64| Decision {
            id: MinionId::parse("web01").unwrap(),
            verdict: Verdict::Deleted,
            version: Version::new(ms << 16, "master-a"),
            context: Context::default(),
            relays: Relays::default(),
            reached: Default::default(),
        };
        let now = 1_800_000_000_000;
        assert_eq!(afresh_ms(&[now], &[], u64::MAX), now + 1);
        assert_eq!(afresh_ms(&[now, now + 12_000, now - 5], &[fetched(now + 3_000)], u64::MAX), now + 12_001);
        assert_eq!(afresh_ms(&[now], &[fetched(now + 20_000)], u64::MAX), now + 20_001);
        assert_eq!(afresh_ms(&[now, now + 3_600_000], &[], now + 300_000), now + 300_001, "a peer far ahead");
    }
}
