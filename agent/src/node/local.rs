//! Local side of the core task: folder events and scans turned into
//! decisions, made durable, audited and sent to the peers.

use std::collections::BTreeSet;
use std::time::Instant;

use super::{wall_ms, Core};
use crate::audit::Record;
use crate::core::observe::interpret;
use crate::core::replica::ObserveMode;
use crate::core::{Decision, Folder, MinionId, Slot, Slots};
use crate::watcher::WatchEvent;

/// Names read and recorded per step of the start-up reconciliation.
const RECONCILE_CHUNK: usize = 5000;

impl Core {
    pub(super) fn on_watch_event(&mut self, event: WatchEvent) {
        match event {
            WatchEvent::Change { folder, name, change } => {
                // The agent's own writes need no reading back.
                let now = Instant::now();
                if !self.echoes.is_echo(folder, &name, change, now) {
                    self.settler.on_event(folder, &name, change, now);
                }
            }
            WatchEvent::Rescan(reason) => {
                // Echoes may have been among the lost events: none is awaited any more.
                self.echoes.clear();
                self.rescan(&reason);
            }
        }
    }

    /// Reads the names whose events have settled.
    pub(super) fn process_due(&mut self) {
        let due = self.settler.take_due(Instant::now());
        if due.is_empty() {
            return;
        }
        let decisions: Vec<Decision> =
            due.iter().filter_map(|name| self.observe_name(name, ObserveMode::Live, true)).collect();
        self.record_local(decisions, None);
        if self.pending.capacity() > 4 * self.pending.len() + 1024 {
            // A burst of pending keys was decided: hand the map's memory back.
            self.pending.shrink_to_fit();
        }
        // Not over a local change that could not be recorded: the retry finds it first.
        if !self.rescan_pending {
            self.apply_deferred();
        }
    }

    /// Reads one name's three files and returns the decision they amount to.
    fn observe_name(&mut self, name: &str, mode: ObserveMode, audit_pending: bool) -> Option<Decision> {
        let id = match MinionId::parse(name) {
            Ok(id) => id,
            Err(e) => {
                self.refuse_once(Folder::Accepted, name, None, &e.to_string());
                return None;
            }
        };
        let slots = self.pki.read_slots(&id);
        self.audit_slots(&id, &slots, audit_pending);
        let decision = self.replica.observe(&id, interpret(&slots), wall_ms(), mode)?;
        // The agent's own write of a peer's decision whose recording failed is
        // not an operator's decision: the retry records it with its version.
        let own_write = self.retry.iter().any(|(_, d)| d.id == decision.id && d.verdict == decision.verdict);
        (!own_write).then_some(decision)
    }

    fn audit_slots(&mut self, id: &MinionId, slots: &Slots, audit_pending: bool) {
        for folder in Folder::ALL {
            match slots.get(folder) {
                Slot::Refused(reason) => self.refuse_once(folder, id.as_str(), Some(id), &reason.to_string()),
                _ => {
                    self.refused.remove(&(folder, id.to_string()));
                }
            }
        }
        match &slots.pending {
            Slot::Key(key) => {
                let known = self.pending.insert(id.clone(), key.fingerprint());
                if audit_pending && known != Some(key.fingerprint()) {
                    self.audit.record(Record {
                        minion: Some(id.to_string()),
                        fingerprint: Some(key.fingerprint().to_string()),
                        origin: Some(self.settings.node.clone()),
                        ..Record::new("pending", "local", "observed")
                    });
                }
            }
            _ => {
                self.pending.remove(id);
            }
        }
    }

    /// Audits a refused file once per reason (a rescan finds it again).
    fn refuse_once(&mut self, folder: Folder, name: &str, id: Option<&MinionId>, reason: &str) {
        let key = (folder, name.to_string());
        if self.refused.get(&key).is_some_and(|seen| seen == reason) {
            return;
        }
        tracing::warn!(folder = folder.dir_name(), file = name, reason, "refused key file");
        self.audit.record(Record {
            minion: Some(id.map_or_else(|| name.escape_debug().to_string(), MinionId::to_string)),
            origin: Some(self.settings.node.clone()),
            reason: Some(format!("{}/{}: {reason}", folder.dir_name(), name.escape_debug())),
            ..Record::new("refuse", "local", "refused")
        });
        self.refused.insert(key, reason.to_string());
    }

    /// Makes local decisions durable, holds them, audits and sends them.
    pub(super) fn record_local(&mut self, decisions: Vec<Decision>, reason: Option<&str>) {
        if decisions.is_empty() {
            return;
        }
        let started = Instant::now();
        // The files were written by salt-key, which does not fsync: flush
        // them first, or a crash could lose a file whose decision was sent.
        // On failure nothing is held or sent: a scan after the backoff finds
        // the same changes again.
        if let Err(e) = self.pki.sync() {
            self.trouble.failed(&self.audit, &format!("syncfs {}", self.pki.root().display()), &e.to_string());
            self.rescan_pending = true;
            return;
        }
        let t_synced = started.elapsed();
        let initialize = !self.first_start_in_steps;
        if let Err(e) = self.store.record_with(&decisions, &[], &self.settings.node, self.replica.clock(), initialize) {
            self.trouble.failed(&self.audit, "state store", &e.to_string());
            self.rescan_pending = true;
            return;
        }
        let t_recorded = started.elapsed();
        if self.retry.is_empty() {
            self.trouble.succeeded(&self.audit);
        }
        let audit = self.audit.clone();
        let mut records = audit.batch();
        for decision in &decisions {
            self.replica.commit(decision);
            tracing::info!(minion = %decision.id, action = decision.verdict.kind().action(), version = %decision.version, "local decision");
            records.push(Record {
                minion: Some(decision.id.to_string()),
                fingerprint: decision.verdict.fingerprint().map(|f| f.to_string()),
                origin: Some(self.settings.node.clone()),
                version: Some(decision.version.to_string()),
                other_version: decision.supersedes.as_ref().map(ToString::to_string),
                reason: reason.map(str::to_string),
                ..Record::new(decision.verdict.kind().action(), "local", "applied")
            });
        }
        drop(records);
        let n = decisions.len();
        let t_audited = started.elapsed();
        self.broadcast(None, decisions);
        // Flushed after sending: the audit lines are written already, and
        // their fsync need not delay the peers (the store holds the decision).
        self.audit.sync();
        tracing::debug!(
            n,
            synced_us = t_synced.as_micros() as u64,
            recorded_us = t_recorded.as_micros() as u64,
            audited_us = t_audited.as_micros() as u64,
            flushed_us = started.elapsed().as_micros() as u64,
            "recorded local decisions"
        );
    }

    /// Compares every name in the folders, and every id held, with the store.
    /// Ids whose events are still settling are left to the settler.
    pub(super) fn rescan(&mut self, why: &str) {
        let Some(names) = self.all_names() else { return };
        let names: Vec<String> = names.into_iter().filter(|name| !self.settler.is_unsettled(name)).collect();
        // Until a first start's files are recorded they keep bootstrap
        // versions: a stale master must not turn them into live decisions.
        let mode = if self.first_start_unrecorded { ObserveMode::FirstStart } else { ObserveMode::Live };
        let decisions: Vec<Decision> = names.iter().filter_map(|name| self.observe_name(name, mode, true)).collect();
        if !decisions.is_empty() {
            tracing::warn!(n = decisions.len(), why, "rescan found changes no event reported");
        }
        self.record_local(decisions, Some("found by rescan"));
        if !self.rescan_pending {
            self.first_start_unrecorded = false;
        }
    }

    /// Every name in the three folders and every id held; `None` when the
    /// folders cannot be listed (logged).
    fn all_names(&self) -> Option<BTreeSet<String>> {
        let listed = match self.pki.list() {
            Ok(listed) => listed,
            Err(e) => {
                tracing::error!(error = %e, "cannot list the key folders");
                return None;
            }
        };
        let mut names: BTreeSet<String> = listed.into_iter().map(|(_, name)| name).collect();
        names.extend(self.replica.entries().map(|(id, _)| id.to_string()));
        Some(names)
    }

    /// Start-up: finds what changed while the agent was stopped. On the very
    /// first start, what the folders hold gets the bootstrap version.
    pub(super) fn reconcile(&mut self, initialized: bool) {
        let mode = if initialized { ObserveMode::Live } else { ObserveMode::FirstStart };
        let names: Vec<String> = self.all_names().unwrap_or_default().into_iter().collect();
        let reason = if initialized { "changed while the agent was stopped" } else { "found at first start" };
        // Pending keys are audited here too: those that arrived while the agent
        // was stopped are recorded nowhere else (one already audited before a
        // restart is recorded again, as present at start-up). Recorded a
        // chunk at a time: a first start on 100,000 keys then never holds
        // them all (with their key bytes) in memory at once.
        // A first start recorded in steps leaves the store uninitialized until
        // every step is recorded: a crash in between is a first start again,
        // never a restart whose unrecorded files would be taken as new decisions.
        self.first_start_in_steps = !initialized;
        let mut n_found = 0;
        for chunk in names.chunks(RECONCILE_CHUNK) {
            let decisions: Vec<Decision> =
                chunk.iter().filter_map(|name| self.observe_name(name, mode, true)).collect();
            n_found += decisions.len();
            self.record_local(decisions, Some(reason));
        }
        self.first_start_in_steps = false;
        tracing::info!(n_held = self.replica.len(), n_found, reason, "start-up reconciliation");
        if !initialized && !self.rescan_pending {
            // Marks the store initialized: the next start is not a first start.
            // (When a step failed, the retry's recording marks it.)
            if let Err(e) = self.store.record(&[], &[], &self.settings.node, self.replica.clock()) {
                tracing::error!(error = %e, "cannot initialize the state store");
            }
        }
        self.first_start_unrecorded = !initialized && self.rescan_pending;
    }
}
