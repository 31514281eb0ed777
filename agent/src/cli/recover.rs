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
    for peer in &config.peers {
        match tokio::time::timeout(PEER_TIMEOUT, fetch_all(config, peer, &tls, &local)).await {
            Ok(Ok(decisions)) => {
                answered.push((peer.name.clone(), decisions.len()));
                for decision in decisions {
                    let newer = newest.get(&decision.id).is_none_or(|held| held.version < decision.version);
                    if newer {
                        newest.insert(decision.id.clone(), decision);
                    }
                }
            }
            Ok(Err(e)) => {
                unreachable.push((peer.name.clone(), crate::net::cause::describe(e.as_ref(), &peer.name, &config.node)))
            }
            Err(_) => unreachable.push((peer.name.clone(), format!("no answer within {PEER_TIMEOUT:?}"))),
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
    state_guard::write_marker(&pki, store.id(), &config.node)?;
    Ok(Recovered { n_decisions: decisions.len(), answered, unreachable, moved_aside, store_id: store.id().to_string() })
}

/// Every decision `peer` holds: its summaries for all buckets (an empty
/// store's digests differ from every non-empty bucket), then the decisions;
/// and whatever it holds for the `local` ids (its deletes of them).
async fn fetch_all(
    config: &Config,
    peer: &Peer,
    tls: &keysync_server::TlsSetup,
    local: &[String],
) -> Result<Vec<Decision>> {
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
    if hello.node != peer.name {
        bail!("peer answered Hello as {:?}", hello.node);
    }
    let request = v1::DiffRequest { n_buckets: N_BUCKETS as u32, digests: vec![0; N_BUCKETS] };
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
        let mut stream = client.fetch(v1::FetchRequest { minions: chunk.to_vec() }).await?.into_inner();
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
    Ok(decisions)
}
