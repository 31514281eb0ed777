//! Peer side of the core task: merging peers' decisions, applying the newer
//! ones to the folders durably, and forwarding them on.

use std::collections::HashMap;

use super::{wall_ms, Core};
use crate::audit::Record;
use crate::core::merge::{Conflict, MergeOutcome};
use crate::core::{Decision, Folder, MinionId, VerdictKind};
use crate::pki::{drop_dfn, Applied};

/// A decision chosen for applying, with what the merge said about it.
struct Accepted {
    decision: Decision,
    conflict: Option<Conflict>,
}

impl Core {
    /// Merges decisions from `from`, applies the newer ones, and returns how
    /// many were applied.
    pub(super) fn apply_remote(&mut self, from: &str, decisions: Vec<Decision>) -> u32 {
        let now = wall_ms();
        let max_skew = self.settings.max_clock_skew.as_millis() as u64;
        let mut chosen: HashMap<MinionId, Accepted> = HashMap::new();
        for decision in decisions {
            if self.settler.is_unsettled(decision.id.as_str()) {
                // A salt-key run on this id is in progress here: writing now would
                // mix with it. Merged once its events have settled (apply_deferred).
                tracing::debug!(minion = %decision.id, peer = from, "deferred: the id's own events are settling");
                self.deferred.push((from.to_string(), decision));
                continue;
            }
            match self.replica.merge(&decision, now, max_skew) {
                Err(skew) => {
                    // Audited once: anti-entropy offers the same version again and again.
                    if self.reported.insert((decision.id.clone(), decision.version.clone())) {
                        self.metrics.decisions_refused.inc();
                        tracing::warn!(minion = %decision.id, peer = from, error = %skew, "refused a decision from the future");
                        self.audit_remote(&decision, from, "refuse", "refused", Some(skew.to_string()));
                    }
                }
                Ok(MergeOutcome::Duplicate) => {}
                Ok(MergeOutcome::Superseded { conflict }) => {
                    if let Some(conflict) = conflict {
                        self.audit_conflict(&decision, from, &conflict);
                    }
                    let reason = self.replica.entry(&decision.id).map(|held| format!("holds newer {}", held.version));
                    self.audit_remote(&decision, from, decision.verdict.kind().action(), "superseded", reason);
                }
                Ok(MergeOutcome::Apply { conflict }) => {
                    // Several decisions for one id in a batch: the newest wins here too.
                    let newer = chosen.get(&decision.id).is_none_or(|c| c.decision.version < decision.version);
                    if newer {
                        chosen.insert(decision.id.clone(), Accepted { decision, conflict });
                    }
                }
            }
        }
        let mut batch: Vec<Accepted> = chosen.into_values().collect();
        batch.sort_by(|a, b| a.decision.id.cmp(&b.decision.id));
        self.apply_batch(from, batch)
    }

    fn apply_batch(&mut self, from: &str, batch: Vec<Accepted>) -> u32 {
        if batch.is_empty() {
            return 0;
        }
        let started = std::time::Instant::now();
        let decisions: Vec<Decision> = batch.iter().map(|a| a.decision.clone()).collect();
        if let Err(e) = self.store.journal(&decisions) {
            self.trouble.failed(&self.audit, "state store journal", &e.to_string());
            self.retry.extend(decisions.into_iter().map(|d| (from.to_string(), d)));
            return 0;
        }
        // Revoking: this master held the id as accepted, or still has it in
        // minions/. The held entry counts too, because a retried or
        // journalled decision may find its own earlier write already there.
        let had_accepted: Vec<bool> = batch
            .iter()
            .map(|accepted| {
                let decision = &accepted.decision;
                decision.verdict.kind() != VerdictKind::Accepted
                    && (self.replica.entry(&decision.id).is_some_and(|held| held.kind == VerdictKind::Accepted)
                        || self.pki.folder_path(Folder::Accepted).join(decision.id.as_str()).symlink_metadata().is_ok())
            })
            .collect();
        let results = self.pki.apply_all(&batch.iter().map(|accepted| &accepted.decision).collect::<Vec<_>>());
        let now = std::time::Instant::now();
        self.echoes.expire(now);
        for (accepted, result) in batch.iter().zip(&results) {
            if let Ok(applied) = result {
                self.echoes.expect(accepted.decision.id.as_str(), &applied.changes, now);
            }
        }
        let mut written = Vec::new();
        let mut revoked = false;
        for ((accepted, had_accepted), result) in batch.into_iter().zip(had_accepted).zip(results) {
            let decision = &accepted.decision;
            match result {
                Ok(applied) => {
                    revoked |= had_accepted;
                    written.push((accepted, applied));
                }
                Err(e) => {
                    // Nothing recorded for it: peers still see this node without it.
                    let what = format!("{} for {}", self.pki.root().display(), decision.id);
                    self.trouble.failed(&self.audit, &what, &e.to_string());
                    self.retry.push((from.to_string(), accepted.decision));
                }
            }
        }
        if written.is_empty() {
            return 0;
        }
        let t_written = started.elapsed();
        let decisions: Vec<Decision> = written.iter().map(|(a, _)| a.decision.clone()).collect();
        let ids: Vec<MinionId> = decisions.iter().map(|d| d.id.clone()).collect();
        let synced = self.pki.sync().map_err(|e| e.to_string());
        let t_synced = started.elapsed();
        let durable = synced.and_then(|()| {
            self.store.record(&decisions, &ids, &self.settings.node, self.replica.clock()).map_err(|e| e.to_string())
        });
        let t_recorded = started.elapsed();
        if let Err(e) = durable {
            // Not held, not forwarded: retried, and the journal finishes it after a crash.
            self.trouble.failed(&self.audit, "syncfs or state store", &e);
            self.retry.extend(decisions.into_iter().map(|d| (from.to_string(), d)));
            return 0;
        }
        if self.retry.is_empty() && !self.rescan_pending {
            self.trouble.succeeded(&self.audit);
        }
        if revoked {
            self.drop_dfn();
        }
        let now = wall_ms();
        let audit = self.audit.clone();
        let mut records = audit.batch();
        for (accepted, applied) in &written {
            let version = &accepted.decision.version;
            // Bootstrap versions carry no decision time: no latency for them.
            self.metrics.applied(if version.is_bootstrap() { 0 } else { version.millis() }, now);
            // Audited first: a conflict record describes the decision held before.
            self.applied_records(from, accepted, applied, &mut records);
            self.replica.commit(&accepted.decision);
        }
        drop(records);
        let n_applied = decisions.len() as u32;
        let t_audited = started.elapsed();
        self.broadcast(Some(from), decisions);
        // After forwarding: the audit lines are written, the store holds the decisions.
        self.audit.sync();
        tracing::debug!(
            peer = from,
            n = n_applied,
            written_us = t_written.as_micros() as u64,
            synced_us = t_synced.as_micros() as u64,
            recorded_us = t_recorded.as_micros() as u64,
            audited_us = t_audited.as_micros() as u64,
            flushed_us = started.elapsed().as_micros() as u64,
            "applied a batch"
        );
        n_applied
    }

    /// Start-up: applies decisions journalled before a crash, unless
    /// something newer is held by now.
    pub(super) fn finish_journal(&mut self, journal: Vec<Decision>) {
        if journal.is_empty() {
            return;
        }
        tracing::info!(n = journal.len(), "finishing decisions interrupted by a stop");
        let batch = journal
            .into_iter()
            .filter(|d| self.replica.entry(&d.id).is_none_or(|held| held.version < d.version))
            .map(|decision| Accepted { decision, conflict: None })
            .collect();
        self.apply_batch("journal", batch);
    }

    /// Retries failed writes once the backoff allows: peers' decisions, and
    /// a scan for local decisions that could not be recorded.
    pub(super) fn retry_failed(&mut self) {
        if !self.trouble.retry_due() {
            return;
        }
        // The operator's unrecorded changes first (the agent's own half-done
        // writes for the retried decisions are not taken for them: see
        // `observe_name`), so a peer's decision retried next meets them as a
        // conflict instead of overwriting them.
        if std::mem::take(&mut self.rescan_pending) {
            self.rescan("retry after a failed write");
        }
        let mut by_peer: HashMap<String, Vec<Decision>> = HashMap::new();
        for (from, decision) in std::mem::take(&mut self.retry) {
            by_peer.entry(from).or_default().push(decision);
        }
        for (from, decisions) in by_peer {
            self.apply_remote(&from, decisions);
        }
        if !self.rescan_pending {
            self.apply_deferred();
        }
        if self.retry.is_empty() && !self.rescan_pending {
            self.trouble.succeeded(&self.audit);
        }
    }

    /// Merges the peers' decisions deferred while their ids were settling,
    /// for the ids that have settled since (the local decision, if any, is
    /// recorded first, so a concurrent one is seen as a conflict).
    pub(super) fn apply_deferred(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|(_, d)| !self.settler.is_unsettled(d.id.as_str()));
        self.deferred = waiting;
        let mut by_peer: HashMap<String, Vec<Decision>> = HashMap::new();
        for (from, decision) in ready {
            by_peer.entry(from).or_default().push(decision);
        }
        for (from, decisions) in by_peer {
            self.apply_remote(&from, decisions);
        }
    }

    fn drop_dfn(&self) {
        match drop_dfn(&self.settings.cachedir, &self.settings.master_id, self.owner) {
            Ok(true) => {
                tracing::info!(cachedir = %self.settings.cachedir.display(), "dropped .dfn: the master rotates its AES key")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(cachedir = %self.settings.cachedir.display(), error = %e, "cannot drop .dfn; revoked minions stay connected until the master rotates its key");
                self.audit.record(Record {
                    reason: Some(format!("cannot drop {}/.dfn: {e}", self.settings.cachedir.display())),
                    ..Record::new("rotate", "local", "failed")
                });
            }
        }
    }

    fn applied_records(&mut self, from: &str, accepted: &Accepted, applied: &Applied, out: &mut crate::audit::Batch) {
        let decision = &accepted.decision;
        if let Some(conflict) = &accepted.conflict {
            out.extend(self.conflict_record(decision, from, conflict));
        }
        tracing::trace!(minion = %decision.id, peer = from, version = %decision.version, "applied peer decision");
        out.push(remote_record(decision, from, decision.verdict.kind().action(), "applied", None));
        if let Some(pending) = &applied.discarded_pending {
            out.push(Record {
                minion: Some(decision.id.to_string()),
                fingerprint: Some(pending.fingerprint().to_string()),
                other_fingerprint: decision.verdict.fingerprint().map(|f| f.to_string()),
                origin: Some(decision.version.node.to_string()),
                reason: Some("a different pending key was discarded for the decided one".into()),
                ..Record::new("pending", from, "discarded")
            });
        }
    }

    fn audit_remote(&self, decision: &Decision, from: &str, action: &str, outcome: &str, reason: Option<String>) {
        self.audit.record(remote_record(decision, from, action, outcome, reason));
    }

    fn audit_conflict(&mut self, decision: &Decision, from: &str, conflict: &Conflict) {
        if let Some(record) = self.conflict_record(decision, from, conflict) {
            self.audit.record(record);
        }
    }

    /// The record of a conflict, once per losing version: the loser arriving
    /// again (from another peer, or by anti-entropy) is the same conflict.
    fn conflict_record(&mut self, decision: &Decision, from: &str, conflict: &Conflict) -> Option<Record> {
        if !self.reported.insert((decision.id.clone(), conflict.loser.clone())) {
            return None;
        }
        let held = self.replica.entry(&decision.id);
        let (winner_fp, loser_fp) = if conflict.winner == decision.version {
            (decision.verdict.fingerprint(), held.and_then(|h| h.fingerprint))
        } else {
            (held.and_then(|h| h.fingerprint), decision.verdict.fingerprint())
        };
        let kinds = |v: &crate::core::Version| {
            if *v == decision.version {
                decision.verdict.kind().action()
            } else {
                held.map_or("none", |h| h.kind.action())
            }
        };
        self.metrics.decisions_conflicted.inc();
        tracing::warn!(minion = %decision.id, winner = %conflict.winner, loser = %conflict.loser, "concurrent decisions");
        Some(Record {
            minion: Some(decision.id.to_string()),
            fingerprint: winner_fp.map(|f| f.to_string()),
            other_fingerprint: loser_fp.map(|f| f.to_string()),
            origin: Some(conflict.winner.node.to_string()),
            version: Some(conflict.winner.to_string()),
            other_version: Some(conflict.loser.to_string()),
            reason: Some(format!(
                "{} at {} and {} at {} were made concurrently; {} wins",
                kinds(&conflict.winner),
                conflict.winner.node,
                kinds(&conflict.loser),
                conflict.loser.node,
                conflict.winner
            )),
            ..Record::new("conflict", from, "resolved")
        })
    }
}

fn remote_record(decision: &Decision, from: &str, action: &str, outcome: &str, reason: Option<String>) -> Record {
    Record {
        minion: Some(decision.id.to_string()),
        fingerprint: decision.verdict.fingerprint().map(|f| f.to_string()),
        origin: Some(decision.version.node.to_string()),
        version: Some(decision.version.to_string()),
        reason,
        ..Record::new(action, from, outcome)
    }
}
