//! What the agent knows about its peers right now — link state, last
//! contact, the last anti-entropy round, their master's health — kept up to
//! date by the peer links and the RPC handler, read by the control socket
//! (`salt-keysync status`) and mirrored into the metrics.
//!
//! Drift between masters is reported once per detection: a reconnect storm
//! with the same fingerprints adds no audit records and no log lines.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use keysync_machine::PeerName;

use crate::disk::audit::{Action, Outcome, Via};
use crate::disk::audit::{AuditLog, Record};
use crate::disk::health::{compare, compared_settings, local_health, Drift, MasterHealth};
use crate::disk::salt_version::SaltVersion;
use crate::node::{CoreHandle, Request};
use crate::ops::findings::{findings, Finding, Masters, Reported};
use crate::ops::metrics::{Metrics, PeerLabel, SettingLabel};

pub use crate::disk::health::KeyCounts;

/// How long after a peer's last Fetch its round against this master counts
/// as under way. A joining master fetches a chunk every few hundred
/// milliseconds; once a round stalls longer, this master's rounds run again.
pub const FETCHING: std::time::Duration = std::time::Duration::from_secs(5);

/// The state of this node's outbound link to a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    Connecting,
    Up,
    Down,
}

impl std::fmt::Display for LinkState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LinkState::Connecting => "connecting",
            LinkState::Up => "up",
            LinkState::Down => "down",
        })
    }
}

/// One anti-entropy round with a peer and what it found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AntiEntropyRun {
    /// When it finished (RFC 3339).
    pub at: String,
    /// Digest buckets that differed.
    pub differing_buckets: usize,
    /// Decisions the peer lacked (or held older): pushed to it, unless
    /// more than a fetch of them were left to a round of its own.
    pub peer_lacked: usize,
    /// Decisions this node lacked (or held older): fetched from the peer.
    pub we_lacked: usize,
    /// Of those fetched, how many were newer here once merged and applied.
    pub applied: u32,
    pub bytes_sent: usize,
    pub bytes_received: usize,
}

/// One peer as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    pub name: String,
    pub address: String,
    pub state: LinkState,
    /// Why the link last failed, kept while it is not up.
    pub last_error: Option<String>,
    /// Last message from the peer on either direction (RFC 3339).
    pub last_contact: Option<String>,
    /// The last anti-entropy round (counts of what each side lacked then).
    pub anti_entropy: Option<AntiEntropyRun>,
    /// The peer's own report, once it sent one in Hello.
    pub health: Option<MasterHealth>,
    /// What differs from this master (empty while the peer's report is unknown).
    pub drift: Drift,
    /// What the peer says its blast-radius guard holds, per origin, as of
    /// its last Hello (its own claim; an agent of 0.1.0 tells nothing).
    #[serde(default)]
    pub holds: Vec<crate::ops::held::HeldCount>,
    /// Its clocks against this master's, as of its last Hello (`None`
    /// before one, or from an agent that does not send them).
    #[serde(default)]
    pub clock: Option<crate::ops::clocks::PeerClock>,
}

/// Everything `salt-keysync status` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    pub node: String,
    /// This agent's salt-keysync version.
    pub version: String,
    /// The replication protocol this agent speaks (`None` from an agent of
    /// 0.1.0, which did not say).
    #[serde(default)]
    pub protocol_version: Option<u32>,
    pub now: String,
    pub started: String,
    pub keys: KeyCounts,
    pub health: MasterHealth,
    pub peers: Vec<PeerStatus>,
    /// What is wrong with the masters, errors first.
    #[serde(default)]
    pub findings: Vec<Finding>,
    /// Ids whose masters keep different keys until an operator decides
    /// (first contact, docs/adopting.md), with what this master shows.
    #[serde(default)]
    pub conflicts: Vec<crate::ops::site_plan::Entry>,
    /// Peers' deletes the blast-radius guard holds here, per origin.
    #[serde(default)]
    pub held: Vec<crate::ops::held::HeldBurst>,
    /// Deletes made on this master that peers say their guards hold.
    #[serde(default)]
    pub held_by_peers: Vec<crate::ops::held::HeldByPeer>,
    /// Peers' decisions refused here, per peer and cause (last hour, since start).
    #[serde(default)]
    pub refused: Vec<crate::ops::refused::PeerRefusals>,
    /// While writes fail here (a full disk): for how long, and why.
    #[serde(default)]
    pub write_trouble: Option<String>,
    /// Out of contact for longer than `tombstone_ttl`: why this master
    /// offers nothing, and the way out.
    #[serde(default)]
    pub stale: Option<String>,
}

struct PeerEntry {
    status: PeerStatus,
    /// When the peer last fetched from this master, in an anti-entropy round
    /// of its own (see [`Board::peer_fetching`]).
    fetched_at: Option<std::time::Instant>,
    /// The drift last reported (audited and logged), to report each once.
    reported: Option<(Drift, Option<String>)>,
}

/// Shared by every task of one agent.
pub struct Board {
    node: String,
    pki_dir: PathBuf,
    master_config: PathBuf,
    started: String,
    audit: Arc<AuditLog>,
    metrics: Arc<Metrics>,
    salt_version: SaltVersion,
    /// This agent's `max_clock_skew` (told to peers in Hello).
    max_clock_skew: std::time::Duration,
    inner: Mutex<Inner>,
}

struct Inner {
    local: MasterHealth,
    peers: BTreeMap<PeerName, PeerEntry>,
    /// Auto-acceptance and Salt versions of every master, as last reported.
    reported: Reported,
}

impl Inner {
    fn masters<'a>(&'a self, this_node: &'a str) -> Masters<'a> {
        std::iter::once((this_node, Some(&self.local)))
            .chain(self.peers.iter().map(|(name, entry)| (name.as_str(), entry.status.health.as_ref())))
            .collect()
    }
}

impl Board {
    pub fn new(config: &crate::config::Config, audit: Arc<AuditLog>, metrics: Arc<Metrics>) -> Board {
        let local = local_health(&config.pki_dir, &config.salt.master_config);
        for error in &local.errors {
            tracing::warn!(error = %error, "cannot compare this master's key or settings with peers");
        }
        let board = Board {
            node: config.node.clone(),
            pki_dir: config.pki_dir.clone(),
            master_config: config.salt.master_config.clone(),
            started: crate::disk::audit::now_rfc3339(),
            audit,
            metrics,
            salt_version: SaltVersion::start(config.salt.version_command.clone()),
            max_clock_skew: config.timings.max_clock_skew,
            inner: Mutex::new(Inner { local, peers: BTreeMap::new(), reported: Reported::default() }),
        };
        board.set_peers(&config.peers);
        board.evaluate_masters(&mut board.inner.lock().unwrap_or_else(|p| p.into_inner()));
        board
    }

    /// Makes the board list exactly `peers` (at start and after a reload): a new peer starts
    /// as connecting, a removed one leaves the board and its up gauge, a readdressed one keeps
    /// its history under the new address.
    pub fn set_peers(&self, peers: &[crate::config::Peer]) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let wanted: BTreeMap<&str, &crate::config::Peer> = peers.iter().map(|p| (p.name.as_str(), p)).collect();
        let removed: Vec<PeerName> =
            inner.peers.keys().filter(|name| !wanted.contains_key(name.as_str())).cloned().collect();
        for name in removed {
            inner.peers.remove(&name);
            inner.reported.forget(&name, &self.metrics);
            self.metrics.forget_peer(&name);
        }
        for peer in peers {
            if let Some(entry) = inner.peers.get_mut(&peer.name) {
                entry.status.address = peer.address.clone();
                continue;
            }
            self.metrics.peer_up.get_or_create(&PeerLabel { peer: peer.name.to_string() }).set(0);
            self.metrics.know_peers([peer.name.as_str()]);
            let status = PeerStatus {
                name: peer.name.to_string(),
                address: peer.address.clone(),
                state: LinkState::Connecting,
                last_error: None,
                last_contact: None,
                anti_entropy: None,
                health: None,
                drift: Drift::default(),
                holds: Vec::new(),
                clock: None,
            };
            inner.peers.insert(peer.name.clone(), PeerEntry { status, fetched_at: None, reported: None });
        }
    }

    /// This master's Salt version, once `salt.version_command` told it.
    pub fn salt_version(&self) -> Option<String> {
        self.salt_version.current().ok()
    }

    /// The peers as configured now (after the last reload).
    pub fn peers(&self) -> Vec<crate::config::Peer> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .peers
            .iter()
            .map(|(name, e)| crate::config::Peer { name: name.clone(), address: e.status.address.clone() })
            .collect()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn with_peer(&self, peer: &PeerName, f: impl FnOnce(&mut PeerStatus)) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = inner.peers.get_mut(peer) {
            f(&mut entry.status);
        }
    }

    pub fn set_state(&self, peer: &PeerName, state: LinkState, error: Option<String>) {
        self.metrics
            .peer_up
            .get_or_create(&PeerLabel { peer: peer.to_string() })
            .set(i64::from(state == LinkState::Up));
        self.with_peer(peer, |status| {
            status.state = state;
            if state == LinkState::Up {
                status.last_error = None;
            } else if error.is_some() {
                status.last_error = error;
            }
        });
    }

    /// The peer answered or called: it is alive.
    pub fn contact(&self, peer: &PeerName) {
        let now = crate::disk::audit::now_rfc3339();
        let mut known = false;
        self.with_peer(peer, |status| {
            status.last_contact = Some(now);
            known = true;
        });
        if known {
            let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            self.metrics.peer_last_contact.get_or_create(&PeerLabel { peer: peer.to_string() }).set(unix.as_secs_f64());
        }
    }

    /// The peer fetched from this master: an anti-entropy round of its own
    /// against this master is under way.
    pub fn peer_fetched(&self, peer: &PeerName) {
        self.peer_fetched_at(peer, std::time::Instant::now());
    }

    fn peer_fetched_at(&self, peer: &PeerName, at: std::time::Instant) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = inner.peers.get_mut(peer) {
            entry.fetched_at = Some(at);
        }
    }

    /// Whether the peer is fetching from this master in a round of its
    /// own: it fetched within the last [`FETCHING`]. That round brings it
    /// whatever this master holds newer and pushes what it holds newer
    /// itself, so this master's round against it is left to it (see
    /// `net/peers.rs`).
    pub fn peer_fetching(&self, peer: &PeerName) -> bool {
        self.peer_fetching_at(peer, std::time::Instant::now())
    }

    fn peer_fetching_at(&self, peer: &PeerName, now: std::time::Instant) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let fetched_at = inner.peers.get(peer).and_then(|entry| entry.fetched_at);
        fetched_at.is_some_and(|at| now.saturating_duration_since(at) < FETCHING)
    }

    pub fn anti_entropy(&self, peer: &PeerName, run: AntiEntropyRun) {
        self.metrics.anti_entropy_runs.get_or_create(&PeerLabel { peer: peer.to_string() }).inc();
        self.metrics.anti_entropy_bytes(peer, "sent", run.bytes_sent);
        self.metrics.anti_entropy_bytes(peer, "received", run.bytes_received);
        self.with_peer(peer, |status| status.anti_entropy = Some(run));
    }

    /// This master's key counts: decisions held by the core task, and the
    /// files in `minions_pre/` now.
    pub async fn key_counts(&self, core: &CoreHandle) -> KeyCounts {
        let (accepted, rejected, deleted) = core.ask(|reply| Request::Counts { reply }).await.unwrap_or_default();
        let pending = std::fs::read_dir(self.pki_dir.join("minions_pre"))
            .map(|entries| {
                entries.filter_map(Result::ok).filter(|e| !e.file_name().to_string_lossy().starts_with('.')).count()
            })
            .unwrap_or(0);
        KeyCounts { accepted, rejected, pending, deleted }
    }

    /// This master's health with its key counts, for a Hello.
    pub async fn hello_health(&self, core: &CoreHandle) -> MasterHealth {
        let keys = self.key_counts(core).await;
        self.refresh_local(Some(keys))
    }

    /// Runs the salt-master version command again (at a reload).
    pub fn refresh_salt_version(&self) {
        self.salt_version.refresh();
    }

    /// Re-reads this master's master.pub, settings and salt-master version
    /// (they may have been fixed or broken since start) and returns them,
    /// with `keys` when given.
    pub fn refresh_local(&self, keys: Option<KeyCounts>) -> MasterHealth {
        let mut fresh = local_health(&self.pki_dir, &self.master_config);
        match self.salt_version.current() {
            Ok(version) => fresh.salt_version = Some(version),
            Err(e) => fresh.errors.push(format!("salt-master version unknown: {e}")),
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        fresh.keys = keys.or_else(|| inner.local.keys.clone());
        // Key counts change all the time and are not compared.
        let changed =
            MasterHealth { keys: None, ..fresh.clone() } != MasterHealth { keys: None, ..inner.local.clone() };
        inner.local = fresh.clone();
        if changed {
            tracing::info!(master_pub = ?fresh.master_pub, salt_version = ?fresh.salt_version, "this master's key, settings or Salt version changed; comparing again");
            let names: Vec<PeerName> = inner.peers.keys().cloned().collect();
            for name in names {
                self.evaluate(&mut inner, &name);
            }
            self.evaluate_masters(&mut inner);
        }
        fresh
    }

    /// Judges every master again: auto-acceptance and Salt versions.
    fn evaluate_masters(&self, inner: &mut Inner) {
        let mut reported = std::mem::take(&mut inner.reported);
        reported.evaluate(&self.node, &inner.masters(&self.node), &self.audit, &self.metrics);
        inner.reported = reported;
    }

    /// Records what a peer reported about its master in Hello and reports
    /// any new drift.
    pub fn peer_health(&self, peer: &PeerName, health: MasterHealth) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = inner.peers.get_mut(peer) else { return };
        entry.status.health = Some(health);
        self.evaluate(&mut inner, peer);
        self.evaluate_masters(&mut inner);
    }

    /// Records what a peer said in Hello its guard holds, per origin.
    pub fn peer_holds(&self, peer: &PeerName, holds: Vec<crate::ops::held::HeldCount>) {
        self.with_peer(peer, |status| status.holds = holds);
    }

    /// This agent's clocks now, for a Hello: `hlc` is the node's hybrid clock.
    pub fn clock_reading(&self, hlc: u64) -> crate::ops::clocks::ClockReading {
        crate::ops::clocks::ClockReading::now(hlc, self.max_clock_skew)
    }

    /// Compares the clocks a peer's Hello told (`None`: it told none) with
    /// this agent's now, and logs each change of who refuses whose
    /// decisions once (`ops/clocks.rs`).
    pub fn peer_clock(&self, peer: &PeerName, theirs: Option<crate::ops::clocks::ClockReading>, hlc: u64) {
        let clock = theirs.map(|theirs| crate::ops::clocks::compare(theirs, self.clock_reading(hlc)));
        self.with_peer(peer, |status| {
            let was = status.clock.as_ref().map_or((false, false), |c| (c.refused_here, c.refuses_ours));
            let is = clock.as_ref().map_or((false, false), |c| (c.refused_here, c.refuses_ours));
            if let Some(c) = clock.as_ref().filter(|_| is != was) {
                let offset_ms = c.offset_ms;
                match (is.0, was.0) {
                    (true, false) => tracing::error!(
                        peer = peer.as_str(),
                        stamps_ahead_ms = c.peer_stamps_ahead_ms,
                        offset_ms,
                        "the peer stamps its decisions further ahead of this master's clock than max_clock_skew: \
                         they are refused here (status shows it)"
                    ),
                    (false, true) => {
                        tracing::info!(peer = peer.as_str(), "the peer's decisions are within max_clock_skew again")
                    }
                    _ => {}
                }
                match (is.1, was.1) {
                    (true, false) => tracing::error!(
                        peer = peer.as_str(),
                        stamps_ahead_ms = c.our_stamps_ahead_ms,
                        offset_ms,
                        "the peer refuses this master's decisions: stamped further ahead of its clock than its \
                         max_clock_skew (status shows it)"
                    ),
                    (false, true) => {
                        tracing::info!(peer = peer.as_str(), "the peer takes this master's decisions again")
                    }
                    _ => {}
                }
            }
            status.clock = clock;
        });
    }

    fn evaluate(&self, inner: &mut Inner, peer: &PeerName) {
        let local = inner.local.clone();
        let Some(entry) = inner.peers.get_mut(peer) else { return };
        let Some(theirs) = &entry.status.health else { return };
        let drift = compare(&local, theirs);
        let their_pub = theirs.master_pub.clone();
        self.metrics
            .master_key_mismatch
            .get_or_create(&PeerLabel { peer: peer.to_string() })
            .set(i64::from(drift.master_pub_mismatch));
        for setting in compared_settings() {
            let drifted = drift.settings.iter().any(|s| s == setting);
            self.metrics
                .settings_drift
                .get_or_create(&SettingLabel { peer: peer.to_string(), setting: setting.into() })
                .set(i64::from(drifted));
        }
        entry.status.drift = drift.clone();
        let key = (drift.clone(), their_pub.clone());
        let previous = entry.reported.as_ref().map(|(d, _)| d.clone()).unwrap_or_default();
        if entry.reported.as_ref() == Some(&key) || (entry.reported.is_none() && drift.is_empty()) {
            return;
        }
        entry.reported = Some(key);
        self.report(peer, &local, their_pub.as_deref(), &previous, &drift);
    }

    /// Logs loudly and audits a change of drift with `peer`.
    fn report(&self, peer: &PeerName, local: &MasterHealth, their_pub: Option<&str>, previous: &Drift, drift: &Drift) {
        if drift.master_pub_mismatch {
            tracing::error!(
                peer = peer.as_str(),
                ours = local.master_pub.as_deref().unwrap_or("?"),
                theirs = their_pub.unwrap_or("?"),
                "master.pub differs from the peer's: minions of one master will not authenticate the other (\"The Salt Master server's public key did not authenticate!\"); give every master the same master.pem/master.pub. Key decisions keep replicating"
            );
            self.audit.record(Record {
                peer: Some(peer.to_string()),
                fingerprint: local.master_pub.clone(),
                other_fingerprint: their_pub.map(str::to_string),
                reason: Some("master.pub differs from this master's: masters must share one key pair".into()),
                ..Record::new(Action::MasterKey, Via::Peer(peer), Outcome::Mismatch)
            });
        } else if previous.master_pub_mismatch {
            tracing::info!(peer = peer.as_str(), "master.pub now matches the peer's");
            self.audit.record(Record {
                peer: Some(peer.to_string()),
                fingerprint: local.master_pub.clone(),
                ..Record::new(Action::MasterKey, Via::Peer(peer), Outcome::Resolved)
            });
        }
        if !drift.settings.is_empty() && drift.settings != previous.settings {
            let names = drift.settings.join(", ");
            tracing::warn!(peer = peer.as_str(), settings = %names, "master settings differ from the peer's; Salt's multi-master set-up needs them equal on every master");
            self.audit.record(Record {
                peer: Some(peer.to_string()),
                reason: Some(format!("settings differ from this master's: {names}")),
                ..Record::new(Action::Settings, Via::Peer(peer), Outcome::Drift)
            });
        } else if drift.settings.is_empty() && !previous.settings.is_empty() {
            tracing::info!(peer = peer.as_str(), "master settings now match the peer's");
            self.audit.record(Record {
                peer: Some(peer.to_string()),
                reason: Some(format!("settings agree again: {}", previous.settings.join(", "))),
                ..Record::new(Action::Settings, Via::Peer(peer), Outcome::Resolved)
            });
        }
    }

    /// A snapshot for `status`; `keys` come from the core task.
    pub fn report_with(&self, keys: KeyCounts) -> StatusReport {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.local.keys = Some(keys.clone());
        let drift: Vec<(&str, &Drift)> = inner.peers.iter().map(|(name, e)| (name.as_str(), &e.status.drift)).collect();
        let mut findings = findings(&inner.masters(&self.node), &drift);
        let clocks: Vec<(&str, &crate::ops::clocks::PeerClock)> =
            inner.peers.iter().filter_map(|(name, e)| Some((name.as_str(), e.status.clock.as_ref()?))).collect();
        findings.extend(crate::ops::clocks::clock_findings(&self.node, &clocks));
        findings.sort_by_key(|f| f.level);
        StatusReport {
            node: self.node.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: Some(keysync_proto::PROTOCOL_VERSION),
            now: crate::disk::audit::now_rfc3339(),
            started: self.started.clone(),
            keys,
            health: inner.local.clone(),
            peers: inner.peers.values().map(|e| e.status.clone()).collect(),
            findings,
            conflicts: Vec::new(),
            held: Vec::new(),
            held_by_peers: Vec::new(),
            refused: self.metrics.refused.snapshot(),
            write_trouble: None,
            stale: None,
        }
    }

    /// This agent's node name.
    pub fn node(&self) -> &str {
        &self.node
    }
}

#[cfg(test)]
mod tests;
