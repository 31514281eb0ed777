//! The driver around the replication core: one task owns the [`Replica`], the
//! store and the key folders, and serialises everything that changes them —
//! folder events, peers' decisions, anti-entropy requests — so the agent's own
//! writes are always committed before their inotify echo is read.

mod local;
mod remote;
mod trouble;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::audit::AuditLog;
use crate::core::echo::Echoes;
use crate::core::replica::Replica;
use crate::core::settle::Settler;
use crate::core::{Decision, Fingerprint, MinionId, Version};
use crate::pki::{Owner, Pki};
use crate::store::Store;
use crate::watcher::WatchEvent;

/// Decisions leaving this node for its peers. `from`: the peer they came
/// from, which need not get them back.
#[derive(Debug)]
pub struct Outgoing {
    pub from: Option<String>,
    pub decisions: Vec<Decision>,
}

/// `(id, version)` pairs: what anti-entropy compares.
pub type Summaries = Vec<(MinionId, Version)>;

/// Requests the rest of the agent makes of the core task.
pub enum Request {
    /// Decisions received from `from` (already validated); replies with how
    /// many were newer and applied.
    Remote { from: String, decisions: Vec<Decision>, reply: oneshot::Sender<u32> },
    /// A peer's bucket digests; replies with the differing buckets and this
    /// node's summaries in them.
    Diff { theirs: Vec<u64>, reply: oneshot::Sender<(Vec<u32>, Summaries)> },
    /// Full decisions for ids.
    Fetch { ids: Vec<MinionId>, reply: oneshot::Sender<Vec<Decision>> },
    /// This node's digests, for its own anti-entropy round.
    Digests { reply: oneshot::Sender<Vec<u64>> },
    /// Compares a peer's summaries of `buckets` with this node: replies with
    /// the ids newer on the peer, and the decisions newer here.
    Compare {
        buckets: Vec<u32>,
        summaries: Vec<(MinionId, Version)>,
        reply: oneshot::Sender<(Vec<MinionId>, Vec<Decision>)>,
    },
    /// Of a peer's summaries, the ids it holds newer than this node.
    NewerOnPeer { summaries: Summaries, reply: oneshot::Sender<Vec<MinionId>> },
    /// Number of decisions held.
    Count { reply: oneshot::Sender<usize> },
    /// Decisions held per verdict: (accepted, rejected, deleted), for `status`.
    Counts { reply: oneshot::Sender<(usize, usize, usize)> },
}

/// A cloneable handle on the core task.
#[derive(Clone)]
pub struct CoreHandle {
    requests: mpsc::Sender<Request>,
    outgoing: broadcast::Sender<Arc<Outgoing>>,
}

#[derive(Debug, thiserror::Error)]
#[error("the agent's core task has stopped")]
pub struct CoreGone;

impl CoreHandle {
    pub async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Request) -> Result<T, CoreGone> {
        let (tx, rx) = oneshot::channel();
        self.requests.send(make(tx)).await.map_err(|_| CoreGone)?;
        rx.await.map_err(|_| CoreGone)
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Outgoing>> {
        self.outgoing.subscribe()
    }
}

/// Settings of the core task, from the config.
#[derive(Clone, Debug)]
pub struct CoreSettings {
    pub node: String,
    pub cachedir: std::path::PathBuf,
    pub master_id: String,
    pub max_clock_skew: Duration,
    pub rescan_interval: Duration,
}

pub struct Core {
    settings: CoreSettings,
    replica: Replica,
    store: Store,
    pki: Pki,
    owner: Owner,
    settler: Settler,
    /// Changes the agent made in the watched folders, to be heard back.
    echoes: Echoes,
    audit: Arc<AuditLog>,
    metrics: Arc<crate::metrics::Metrics>,
    outgoing: broadcast::Sender<Arc<Outgoing>>,
    /// Pending keys seen, to audit each new one once.
    pending: HashMap<MinionId, Fingerprint>,
    /// Refused files already audited, to audit each once per content.
    refused: HashMap<(crate::core::Folder, String), String>,
    /// Peers' decisions whose files could not be written; retried.
    retry: Vec<(String, Decision)>,
    /// Peers' decisions for ids whose own events were still settling (a
    /// salt-key run in progress); merged once the id has settled.
    deferred: Vec<(String, Decision)>,
    /// Local decisions could not be made durable: the folders are scanned
    /// again when the backoff allows.
    rescan_pending: bool,
    /// The first start's files could not be recorded yet: rescans keep
    /// observing them as a first start (bootstrap versions).
    first_start_unrecorded: bool,
    /// The first start's files are being recorded in steps: the store is not
    /// marked initialized until the last one.
    first_start_in_steps: bool,
    /// Failing writes: backoff, and one log line and audit record per episode.
    trouble: trouble::WriteTrouble,
    /// Losing versions of conflicts already audited, and peers' versions
    /// already refused for clock skew: each is audited once, however often
    /// it arrives again.
    reported: std::collections::HashSet<(MinionId, Version)>,
}

/// Wall-clock milliseconds for the HLC.
pub fn wall_ms() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    now.saturating_add_signed(crate::fault::clock_offset_ms())
}

const REQUEST_QUEUE: usize = 256;
/// Outgoing batches buffered per peer before a slow peer falls behind and is
/// repaired by anti-entropy instead.
const OUTGOING_QUEUE: usize = 4096;
/// Events handled before the due names are read, so a burst (salt-key -A)
/// becomes a few large batches.
const EVENT_BURST: usize = 8192;
/// Peers' decisions queued together are applied as one batch up to about
/// this many (a join's fetches come 5,000 at a time).
const MAX_GROUPED_DECISIONS: usize = 10_000;
/// Requests handled in one turn of the core loop, at most.
const REQUEST_BURST: usize = 64;
/// How often failed writes are looked at; the backoff decides whether they are retried.
const RETRY_INTERVAL: Duration = Duration::from_millis(250);

impl Core {
    /// Runs the core task until `shutdown`.
    pub async fn run(
        mut self,
        mut events: mpsc::UnboundedReceiver<WatchEvent>,
        mut requests: mpsc::Receiver<Request>,
        shutdown: CancellationToken,
    ) {
        let mut rescan =
            tokio::time::interval_at(Instant::now() + self.settings.rescan_interval, self.settings.rescan_interval);
        rescan.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut retry = tokio::time::interval(RETRY_INTERVAL);
        retry.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let due = self.settler.next_due().map(Instant::from_std);
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                event = events.recv() => {
                    let Some(event) = event else { break };
                    self.on_watch_event(event);
                    for _ in 0..EVENT_BURST {
                        match events.try_recv() {
                            Ok(event) => self.on_watch_event(event),
                            Err(_) => break,
                        }
                    }
                    self.process_due();
                }
                () = sleep_until(due), if due.is_some() => self.process_due(),
                request = requests.recv() => {
                    let Some(request) = request else { break };
                    self.on_requests(request, &mut requests);
                }
                _ = rescan.tick() => {
                    self.echoes.expire(std::time::Instant::now());
                    self.rescan("periodic safety net");
                }
                _ = retry.tick(), if !self.retry.is_empty() || self.rescan_pending => self.retry_failed(),
            }
        }
        self.audit.sync();
    }

    /// Handles `first` and the requests already queued behind it, in order.
    /// Peers' decisions queued together (several peers pushing, or one
    /// pushing while the last batch was being written) are applied as one
    /// batch: the journal commit, syncfs, store commit and audit flush are
    /// paid once for all of them, so a node that falls behind catches up
    /// instead of paying them again for every small batch.
    fn on_requests(&mut self, first: Request, queue: &mut mpsc::Receiver<Request>) {
        let mut arrivals: Vec<(String, Vec<Decision>, oneshot::Sender<u32>)> = Vec::new();
        let (mut n_decisions, mut n_requests) = (0, 0);
        let mut next = Some(first);
        while let Some(request) = next.take() {
            n_requests += 1;
            match request {
                Request::Remote { from, decisions, reply } => {
                    n_decisions += decisions.len();
                    arrivals.push((from, decisions, reply));
                }
                other => {
                    self.apply_queued(std::mem::take(&mut arrivals));
                    n_decisions = 0;
                    self.on_request(other);
                }
            }
            // Bounded, so folder events are not kept waiting behind a long queue.
            if n_decisions < MAX_GROUPED_DECISIONS && n_requests < REQUEST_BURST {
                next = queue.try_recv().ok();
            }
        }
        self.apply_queued(arrivals);
    }

    fn apply_queued(&mut self, arrivals: Vec<(String, Vec<Decision>, oneshot::Sender<u32>)>) {
        if arrivals.is_empty() {
            return;
        }
        let (batches, replies): (Vec<_>, Vec<_>) =
            arrivals.into_iter().map(|(from, decisions, reply)| ((from, decisions), reply)).unzip();
        for (reply, n_applied) in replies.into_iter().zip(self.apply_arrivals(batches)) {
            let _ = reply.send(n_applied);
        }
    }

    fn on_request(&mut self, request: Request) {
        match request {
            Request::Remote { from, decisions, reply } => self.apply_queued(vec![(from, decisions, reply)]),
            Request::Diff { theirs, reply } => {
                let buckets = self.replica.digests().differing(&theirs);
                let summaries = self.replica.summaries_in(&buckets);
                let _ = reply.send((buckets, summaries));
            }
            Request::Fetch { ids, reply } => {
                let _ = reply.send(self.fetch(&ids));
            }
            Request::Digests { reply } => {
                let _ = reply.send(self.replica.digests().as_slice().to_vec());
            }
            Request::Compare { buckets, summaries, reply } => {
                let _ = reply.send(self.compare(&buckets, &summaries));
            }
            Request::NewerOnPeer { summaries, reply } => {
                let _ = reply.send(self.replica.newer_on_peer(&summaries));
            }
            Request::Count { reply } => {
                let _ = reply.send(self.replica.len());
            }
            Request::Counts { reply } => {
                let mut counts = (0, 0, 0);
                for (_, entry) in self.replica.entries() {
                    match entry.kind {
                        crate::core::VerdictKind::Accepted => counts.0 += 1,
                        crate::core::VerdictKind::Rejected => counts.1 += 1,
                        crate::core::VerdictKind::Deleted => counts.2 += 1,
                    }
                }
                let _ = reply.send(counts);
            }
        }
    }

    fn fetch(&self, ids: &[MinionId]) -> Vec<Decision> {
        match self.store.get(ids) {
            Ok(decisions) => decisions,
            Err(e) => {
                tracing::error!(error = %e, "cannot read decisions for a peer");
                Vec::new()
            }
        }
    }

    /// What differs from a peer's summaries of `buckets`: ids newer there,
    /// and full decisions newer here (or unknown there).
    fn compare(&self, buckets: &[u32], summaries: &[(MinionId, Version)]) -> (Vec<MinionId>, Vec<Decision>) {
        let newer_there = self.replica.newer_on_peer(summaries);
        let theirs: HashMap<&MinionId, &Version> = summaries.iter().map(|(id, v)| (id, v)).collect();
        let newer_here: Vec<MinionId> = self
            .replica
            .summaries_in(buckets)
            .into_iter()
            .filter(|(id, version)| theirs.get(id).is_none_or(|their| *their < version))
            .map(|(id, _)| id)
            .collect();
        (newer_there, self.fetch(&newer_here))
    }

    fn broadcast(&self, from: Option<&str>, decisions: Vec<Decision>) {
        if decisions.is_empty() {
            return;
        }
        // No receiver just means no peer is connected right now.
        let _ = self.outgoing.send(Arc::new(Outgoing { from: from.map(str::to_string), decisions }));
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Everything [`start`] needs that is opened outside the core.
pub struct CoreParts {
    pub settings: CoreSettings,
    pub store: Store,
    pub pki: Pki,
    pub owner: Owner,
    pub audit: Arc<AuditLog>,
    pub settle: crate::core::settle::SettleTimings,
    /// Counts applied, refused and conflicted decisions.
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// Loads the store, finishes an interrupted apply, reconciles the folders
/// with the store, and returns the core ready to run with its handle.
pub fn start(parts: CoreParts) -> Result<(Core, CoreHandle, mpsc::Receiver<Request>), crate::store::StoreError> {
    let loaded = parts.store.load()?;
    let mut replica = Replica::new(&parts.settings.node, crate::core::version::Hlc::resume(loaded.clock));
    for (id, entry) in loaded.entries {
        replica.load(id, entry);
    }
    let (outgoing, _) = broadcast::channel(OUTGOING_QUEUE);
    let (tx, rx) = mpsc::channel(REQUEST_QUEUE);
    let mut core = Core {
        settings: parts.settings,
        replica,
        store: parts.store,
        pki: parts.pki,
        owner: parts.owner,
        settler: Settler::new(parts.settle),
        echoes: Echoes::default(),
        audit: parts.audit,
        metrics: parts.metrics,
        outgoing: outgoing.clone(),
        pending: HashMap::new(),
        refused: HashMap::new(),
        retry: Vec::new(),
        deferred: Vec::new(),
        rescan_pending: false,
        first_start_unrecorded: false,
        first_start_in_steps: false,
        trouble: trouble::WriteTrouble::default(),
        reported: std::collections::HashSet::new(),
    };
    core.finish_journal(loaded.journal);
    core.reconcile(loaded.initialized);
    Ok((core, CoreHandle { requests: tx, outgoing }, rx))
}

#[cfg(test)]
mod tests;
