//! The core task: one task owns the node machine (`keysync_machine::node`)
//! and its effects, and serialises everything that reaches it — folder
//! events, peers' decisions and anti-entropy requests — so the agent's own
//! writes are always committed before their inotify echo is read. It makes
//! no decision itself: it feeds the machine inputs and the time, and carries
//! out its effects (`effects.rs`), which block, on a thread of its own
//! (`thread.rs`), from its start (`start.rs`); what each event becomes in
//! the audit log, the log and the metrics is `tell.rs`.

mod effects;
mod outgoing;
mod start;
mod tell;
mod thread;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keysync_machine::node::{
    Asking, BadAnswer, Compared, DiffAnswer, Fetch, FsEvent, HeldDelete, Node, Now, OperatorAction, Outcome, Runtime,
    Summaries, Whole,
};
use keysync_machine::PeerName;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::core::{Decision, MinionId};
use crate::disk::audit::{Action, Outcome as AuditOutcome, Via};
use crate::disk::pki::prestage::{Prestaged, PRESTAGE_FROM};
use crate::disk::pki::Pki;
use crate::disk::watcher::{FolderWatch, WatchEvent};
pub use effects::Effects;
pub use start::{prepare, start, CoreParts, StartError, Starting};
pub use thread::{CoreStopped, CoreThread};

pub use outgoing::{Following, Outgoing};

/// Requests the rest of the agent makes of the core task.
pub enum Request {
    /// Decisions pushed by `from` (already validated); replies with how
    /// many were newer and applied.
    Remote { from: PeerName, decisions: Vec<Decision>, reply: oneshot::Sender<u32> },
    /// A peer's bucket digests and the buckets it holds nothing in; replies
    /// with the differing buckets, this node's summaries in them, those of
    /// the empty ones it sends whole, with their sizes, and one of those
    /// sent with the answer (`Node::first_bucket`).
    Diff { theirs: Vec<u64>, empty: Vec<u32>, reply: oneshot::Sender<DiffAnswer> },
    /// Full decisions for ids.
    Fetch { ids: Vec<MinionId>, reply: oneshot::Sender<Vec<Decision>> },
    /// Full decisions for ids and for every id in whole buckets; `None`
    /// when the buckets hold too many ids together.
    FetchWhole { ids: Vec<MinionId>, buckets: Vec<u32>, reply: oneshot::Sender<Option<Vec<Decision>>> },
    /// What this node's own anti-entropy round asks (its digests).
    /// `None`: the node runs no round (stale).
    Digests { reply: oneshot::Sender<Option<Asking>> },
    /// Whether this node joins (`Node::joining`): for its Hello answer.
    Joining { reply: oneshot::Sender<bool> },
    /// Whether this node's rounds offer a peer something
    /// (`Node::offers_something`).
    OffersSomething { reply: oneshot::Sender<bool> },
    /// A link finished comparing digests with its peer.
    Contact,
    /// A peer told (in `Hello`) when the newest delete it forgot was made.
    PeerForgot { peer: PeerName, forgot_ms: u64 },
    /// When the newest delete this node forgot was made, for `Hello` to `peer`.
    ForgotThrough { peer: PeerName, reply: oneshot::Sender<u64> },
    /// The node's hybrid clock, for `Hello` (`ops/clocks.rs`).
    Clock { reply: oneshot::Sender<u64> },
    /// On the link to `peer`, the first chunk of the peer's Diff answer named
    /// the differing buckets: a comparison begins.
    RepairBegin { peer: PeerName, buckets: Vec<u32>, whole: Vec<Whole>, reply: oneshot::Sender<Result<(), BadAnswer>> },
    /// One chunk of the peer's Diff answer, compared as it comes.
    RepairChunk { peer: PeerName, summaries: Summaries, reply: oneshot::Sender<Result<(), BadAnswer>> },
    /// The Diff answer was read whole: how many ids the peer holds newer
    /// (planned for fetching), the ids whose decisions are newer here
    /// (loaded with `Fetch` a chunk at a time, and pushed), and whether the
    /// plan is full (the next round soon).
    RepairEnd { peer: PeerName, reply: oneshot::Sender<Result<Compared, BadAnswer>> },
    /// The Diff answer could not be read whole: the comparison is dropped.
    RepairAbort { peer: PeerName },
    /// The Diff answer named no bucket: `peer` holds what this node holds.
    RepairAgreed { peer: PeerName },
    /// The next ids and whole buckets to fetch from `peer`, `None` when its plan is done.
    RepairNext { peer: PeerName, reply: oneshot::Sender<Option<Fetch>> },
    /// What `fetch` from `peer` brought, its keys perhaps written ahead
    /// (`staged`); replies with how many were applied.
    RepairFetched {
        peer: PeerName,
        fetch: Fetch,
        decisions: Vec<Decision>,
        staged: Option<Prestaged>,
        reply: oneshot::Sender<u32>,
    },
    /// The bucket a peer's Diff answer brought (`Node::repair_brought`).
    RepairBrought { peer: PeerName, fetch: Fetch, decisions: Vec<Decision>, reply: oneshot::Sender<u32> },
    /// The link to `peer` went down: its plan and claims are dropped.
    LinkDown { peer: PeerName },
    /// Number of decisions held.
    Count { reply: oneshot::Sender<usize> },
    /// Decisions held per verdict: (accepted, rejected, deleted), for `status`.
    Counts { reply: oneshot::Sender<(usize, usize, usize)> },
    /// What first contact does here (see `keysync_machine::node::plan`):
    /// the ids in dispute, or exactly `ids`.
    Plan { ids: Option<Vec<MinionId>>, reply: oneshot::Sender<Vec<keysync_machine::node::PlanRow>> },
    /// The plan's conflicts alone, for `status` (see `Node::conflicts`).
    Conflicts { reply: oneshot::Sender<Vec<keysync_machine::node::PlanRow>> },
    /// The peers' deletes the blast-radius guard holds here.
    Held { reply: oneshot::Sender<Vec<HeldDelete>> },
    /// While writes fail: for how long, and the last error.
    WriteTrouble { reply: oneshot::Sender<Option<(Duration, String)>> },
    /// Why the node offers nothing, if it does not.
    Stale { reply: oneshot::Sender<Option<keysync_machine::node::Stale>> },
    /// The configured peers changed (a reload): the origins a peer's
    /// decision may name.
    Masters { names: Vec<String> },
    /// An operator releases or reverts held deletes (from `origin`, of `ids`
    /// if any); `by`: who asked, for the audit log.
    Operator {
        action: OperatorAction,
        origin: Option<String>,
        ids: Vec<MinionId>,
        by: String,
        reply: oneshot::Sender<Result<Outcome, String>>,
    },
}

/// A cloneable handle on the core task.
#[derive(Clone)]
pub struct CoreHandle {
    requests: mpsc::Sender<Request>,
    outgoing: outgoing::Channel,
    /// Where a link writes a fetched chunk's keys ahead; none in observe mode.
    stager: Option<Arc<Pki>>,
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

    /// Sends a request that wants no answer.
    pub async fn tell(&self, request: Request) -> Result<(), CoreGone> {
        self.requests.send(request).await.map_err(|_| CoreGone)
    }

    /// Writes the keys of a fetched chunk ahead (`disk/pki/prestage.rs`),
    /// off the runtime's workers, while the node applies the chunk before
    /// it: only a chunk large enough to be written by several threads, and
    /// never in observe mode.
    pub async fn prestage(&self, decisions: &[Decision]) -> Option<Prestaged> {
        let pki = self.stager.clone()?;
        if decisions.len() < PRESTAGE_FROM {
            return None;
        }
        let keys = crate::disk::pki::prestage::keys_of(decisions);
        tokio::task::spawn_blocking(move || pki.prestage(&keys)).await.ok().flatten()
    }

    /// Follows what the node sends its peers, for `peer`'s link.
    pub fn follow(&self, peer: &PeerName) -> Following {
        self.outgoing.follow(peer)
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
    /// Observe mode: nothing written to the key folders (see `config::Mode`).
    pub observe: bool,
    /// The blast-radius guard.
    pub guard: keysync_machine::node::GuardSettings,
    pub tombstone_ttl: Duration,
    /// The configured peers' names: the origins a peer's decision may name.
    pub masters: Vec<String>,
}

pub struct Core {
    node: Node,
    effects: Effects,
    /// To watch a key folder again once it was replaced and reopened.
    watch: Option<Arc<FolderWatch>>,
    /// Held deletes per origin as last exported to the metrics.
    held_exported: std::collections::BTreeMap<String, i64>,
    /// The guard's [`Node::held_changes`] when `held_exported` was counted.
    held_exported_at: Option<u64>,
}

/// The machine's set of the site's masters, from the peers' names.
fn masters(names: &[String]) -> std::collections::BTreeSet<Arc<str>> {
    names.iter().map(|name| keysync_machine::core::version::node_name(name)).collect()
}

/// Wall-clock milliseconds for the HLC.
pub fn wall_ms() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    now.saturating_add_signed(crate::fault::clock_offset_ms())
}

/// The time now, as the node machine takes it.
fn now() -> Now {
    Now { mono: std::time::Instant::now(), wall_ms: wall_ms() }
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

impl Core {
    /// Writes the marker naming this store in pki_dir (`state_guard.rs`).
    fn mark(&self) -> Result<(), StartError> {
        let effects = &self.effects;
        Ok(crate::disk::state_guard::mark(&effects.pki, effects.store.id(), &effects.node)?)
    }

    /// Runs the core task until `shutdown`.
    async fn run(
        mut self,
        mut events: mpsc::UnboundedReceiver<WatchEvent>,
        mut requests: mpsc::Receiver<Request>,
        shutdown: CancellationToken,
    ) {
        loop {
            let due = self.node.poll_at().map(Instant::from_std);
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                event = events.recv() => {
                    let Some(event) = event else { break };
                    let mut burst = Vec::with_capacity(events.len().min(EVENT_BURST) + 1);
                    burst.push(event);
                    while burst.len() <= EVENT_BURST {
                        match events.try_recv() {
                            Ok(event) => burst.push(event),
                            Err(_) => break,
                        }
                    }
                    let losses = Losses::of(&burst);
                    for (at, event) in burst.into_iter().enumerate() {
                        self.on_watch_event(event, (Some(at) == losses.last).then_some(losses.why.as_str()));
                    }
                    self.node.on_tick(now(), &mut self.effects);
                }
                () = sleep_until(due), if due.is_some() => self.node.on_tick(now(), &mut self.effects),
                request = requests.recv() => {
                    let Some(request) = request else { break };
                    self.on_requests(request, &mut requests);
                }
            }
            self.folders_replaced();
            self.effects.write_told();
            self.export_held();
        }
        self.effects.flush_audit();
    }

    /// Key folders the pki noticed were replaced: told; one reopened is
    /// watched again and every name read again.
    fn folders_replaced(&mut self) {
        let replaced = self.effects.pki.take_replaced();
        if replaced.is_empty() {
            return;
        }
        let mut reopened = false;
        for change in replaced {
            let folder = change.folder.dir_name();
            match change.outcome {
                Ok(()) => {
                    tracing::warn!(folder, "a key folder was replaced by another folder; reopened");
                    self.effects.buffered.push(crate::disk::audit::Record {
                        reason: Some(format!(
                            "{folder}/ was replaced by another folder: reopened, every name read again"
                        )),
                        ..crate::disk::audit::Record::new(Action::Folder, Via::Local, AuditOutcome::Reopened)
                    });
                    if let Some(watch) = &self.watch {
                        if let Err(e) = watch.rewatch(change.folder) {
                            tracing::error!(folder, error = %e, "cannot watch the new folder; the periodic rescan still reads it");
                        }
                    }
                    reopened = true;
                }
                Err(why) => {
                    tracing::error!(folder, reason = %why, "a key folder was replaced by something the agent will not use");
                    self.effects.buffered.push(crate::disk::audit::Record {
                        reason: Some(why),
                        ..crate::disk::audit::Record::new(Action::Refuse, Via::Local, AuditOutcome::Refused)
                    });
                }
            }
        }
        if reopened {
            self.node.on_lost("a key folder was replaced", now(), &mut self.effects);
        }
    }

    /// Sets the held-deletes gauge per origin when it changed.
    fn export_held(&mut self) {
        // Counted again only when the guard held or let go of a delete.
        let changes = self.node.held_changes();
        if self.held_exported_at == Some(changes) {
            return;
        }
        self.held_exported_at = Some(changes);
        let mut now: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
        for held in self.node.held() {
            *now.entry(held.origin().to_string()).or_default() += 1;
        }
        if now == self.held_exported {
            return;
        }
        for origin in self.held_exported.keys().filter(|o| !now.contains_key(*o)) {
            let label = crate::ops::metrics::OriginLabel { origin: origin.clone() };
            self.effects.metrics.held_deletes.get_or_create(&label).set(0);
        }
        for (origin, n) in &now {
            let label = crate::ops::metrics::OriginLabel { origin: origin.clone() };
            self.effects.metrics.held_deletes.get_or_create(&label).set(*n);
        }
        self.held_exported = now;
    }

    /// One event of a burst; `last_loss`: the reasons of the burst's losses
    /// where this is the last of them ([`Losses`]).
    fn on_watch_event(&mut self, event: WatchEvent, last_loss: Option<&str>) {
        match (event, last_loss) {
            (WatchEvent::Change { folder, name, change }, _) => {
                self.node.on_fs(&FsEvent { folder, name, change }, now())
            }
            (WatchEvent::Rescan(_), Some(why)) => self.node.on_lost(why, now(), &mut self.effects),
            (WatchEvent::Rescan(_), None) => self.node.on_lost_again_later(now()),
        }
    }

    /// Handles `first` and the requests already queued behind it, in order.
    /// Peers' decisions queued together (several peers pushing, or one
    /// pushing while the last batch was being written) are applied as one
    /// batch: the journal commit, syncfs, store commit and audit flush are
    /// paid once for all of them, so a node that falls behind catches up
    /// instead of paying them again for every small batch.
    fn on_requests(&mut self, first: Request, queue: &mut mpsc::Receiver<Request>) {
        let mut arrivals: Vec<(PeerName, Vec<Decision>, oneshot::Sender<u32>)> = Vec::new();
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

    fn apply_queued(&mut self, arrivals: Vec<(PeerName, Vec<Decision>, oneshot::Sender<u32>)>) {
        if arrivals.is_empty() {
            return;
        }
        for (from, decisions, _) in &arrivals {
            self.effects.metrics.received(from.as_str(), "push", decisions.len());
        }
        let (batches, replies): (Vec<_>, Vec<_>) =
            arrivals.into_iter().map(|(from, decisions, reply)| ((from, decisions), reply)).unzip();
        let n_applied = self.node.on_batches(batches, now(), &mut self.effects);
        for (reply, n_applied) in replies.into_iter().zip(n_applied) {
            let _ = reply.send(n_applied);
        }
    }

    fn on_request(&mut self, request: Request) {
        match request {
            Request::Remote { from, decisions, reply } => self.apply_queued(vec![(from, decisions, reply)]),
            Request::Diff { theirs, empty, reply } => {
                let _ = reply.send(self.node.diff_answer(&theirs, &empty, &mut self.effects));
            }
            Request::Fetch { ids, reply } => {
                let _ = reply.send(self.node.fetch(&ids, &mut self.effects));
            }
            Request::FetchWhole { ids, buckets, reply } => {
                let answer = self.node.fetch_whole(&buckets, &mut self.effects).map(|mut decisions| {
                    decisions.extend(self.node.fetch(&ids, &mut self.effects));
                    decisions
                });
                let _ = reply.send(answer);
            }
            Request::Digests { reply } => {
                let _ = reply.send(self.node.asking());
            }
            Request::Joining { reply } => {
                let _ = reply.send(self.node.joining());
            }
            Request::OffersSomething { reply } => {
                let _ = reply.send(self.node.offers_something());
            }
            Request::RepairBegin { peer, buckets, whole, reply } => {
                let _ = reply.send(self.node.repair_begin(&peer, &buckets, &whole));
            }
            Request::RepairChunk { peer, summaries, reply } => {
                let _ = reply.send(self.node.repair_chunk(&peer, summaries, &mut self.effects));
            }
            Request::RepairEnd { peer, reply } => {
                let _ = reply.send(self.node.repair_end(&peer));
            }
            Request::RepairAbort { peer } => self.node.repair_abort(&peer),
            Request::RepairAgreed { peer } => self.node.repair_agreed(&peer),
            Request::RepairNext { peer, reply } => {
                let _ = reply.send(self.node.repair_next(&peer));
            }
            Request::RepairFetched { peer, fetch, decisions, staged, reply } => {
                self.effects.metrics.received(peer.as_str(), "fetch", decisions.len());
                self.effects.prestaged = staged;
                let applied = self.node.repair_fetched(&peer, &fetch, decisions, now(), &mut self.effects);
                let _ = reply.send(applied);
                // What was written ahead and not renamed into place is removed
                // (on a blocking thread).
                self.effects.prestaged = None;
            }
            Request::RepairBrought { peer, fetch, decisions, reply } => {
                self.effects.metrics.received(peer.as_str(), "fetch", decisions.len());
                let _ = reply.send(self.node.repair_brought(&peer, &fetch, decisions, now(), &mut self.effects));
            }
            Request::LinkDown { peer } => self.node.link_down(&peer),
            Request::Count { reply } => {
                let _ = reply.send(self.node.len());
            }
            Request::Counts { reply } => {
                let _ = reply.send(self.node.counts());
            }
            Request::WriteTrouble { reply } => {
                let _ = reply.send(self.node.write_trouble(now().mono));
            }
            Request::Stale { reply } => {
                let _ = reply.send(self.node.stale().cloned());
            }
            Request::PeerForgot { peer, forgot_ms } => {
                self.node.on_peer_forgot(&peer, forgot_ms, now(), &mut self.effects)
            }
            Request::ForgotThrough { peer, reply } => {
                let _ = reply.send(self.node.forgot_through(&peer));
            }
            Request::Clock { reply } => {
                let _ = reply.send(self.node.clock());
            }
            Request::Contact => self.node.on_contact(now(), &mut self.effects),
            Request::Plan { ids, reply } => {
                let _ = reply.send(self.node.plan(ids.as_deref()));
            }
            Request::Conflicts { reply } => {
                let _ = reply.send(self.node.conflicts());
            }
            Request::Held { reply } => {
                let _ = reply.send(self.node.held().cloned().collect());
            }
            Request::Masters { names } => self.node.set_masters(masters(&names)),
            Request::Operator { action, origin, ids, by, reply } => {
                let (origin, now) = (origin.as_deref(), now());
                let outcome = match action {
                    OperatorAction::Release => self.node.release_held(origin, &ids, &by, now, &mut self.effects),
                    OperatorAction::Revert => self.node.revert_held(origin, &ids, &by, now, &mut self.effects),
                };
                let _ = reply.send(outcome);
            }
        }
    }
}

/// The losses of events in one burst of folder events (queue overflows
/// that queued up while the core was busy reading, a watch that failed):
/// every name is listed and read again at the last only ([`Node::on_lost`];
/// its listing is the newer and covers what the others' would have found),
/// the earlier ones only forget the echoes awaited
/// ([`Node::on_lost_again_later`]). The events between are taken in order:
/// a file still being written is still held until it is closed.
#[derive(Debug, PartialEq, Eq)]
struct Losses {
    /// Where the last is in the burst.
    last: Option<usize>,
    /// Their reasons, each once, and how many when more than one.
    why: String,
}

impl Losses {
    fn of(burst: &[WatchEvent]) -> Losses {
        let mut reasons: Vec<&str> = Vec::new();
        let (mut last, mut n) = (None, 0);
        for (at, event) in burst.iter().enumerate() {
            if let WatchEvent::Rescan(reason) = event {
                (last, n) = (Some(at), n + 1);
                if !reasons.contains(&reason.as_str()) {
                    reasons.push(reason);
                }
            }
        }
        let why = match n {
            0 | 1 => reasons.concat(),
            n => format!("{} ({n} times in one burst of events)", reasons.join("; ")),
        };
        Losses { last, why }
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
