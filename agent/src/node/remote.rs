//! Peer side of the core task: merging peers' decisions, applying the newer
//! ones to the folders durably, and forwarding them on.

use std::collections::HashMap;
use std::sync::Arc;

use super::{wall_ms, Core};
use crate::audit::Record;
use crate::core::merge::{Conflict, MergeOutcome};
use crate::core::{Decision, Folder, MinionId, VerdictKind};
use crate::pki::{drop_dfn, Applied};

/// A decision chosen for applying, with what the merge said about it.
struct Accepted {
    decision: Decision,
    conflict: Option<Conflict>,
    /// The peer it came from ("journal" at start-up).
    from: Arc<str>,
    /// Which of the arrivals applied together brought it.
    arrival: usize,
}

impl Core {
    /// Merges several peers' arrivals of decisions and applies the newer
    /// ones as one batch: one journal commit, one syncfs, one store commit
    /// and one audit flush for all of them. Returns, per arrival, how many of
    /// its decisions were applied.
    pub(super) fn apply_arrivals(&mut self, arrivals: Vec<(String, Vec<Decision>)>) -> Vec<u32> {
        let now = wall_ms();
        let max_skew = self.settings.max_clock_skew.as_millis() as u64;
        let n_arrivals = arrivals.len();
        let mut chosen: HashMap<MinionId, Accepted> = HashMap::new();
        // Decisions about an id another arrival also brings: merged after this
        // batch is held, against it, as if they had come one after the other
        // (two peers' concurrent decisions are then seen as a conflict).
        let mut later: Vec<Vec<Decision>> = vec![Vec::new(); n_arrivals];
        let mut froms: Vec<String> = Vec::with_capacity(n_arrivals);
        for (arrival, (from, decisions)) in arrivals.into_iter().enumerate() {
            froms.push(from.clone());
            let from: Arc<str> = from.into();
            for decision in decisions {
                let from = &from;
                if self.settler.is_unsettled(decision.id.as_str()) {
                    // A salt-key run on this id is in progress here: writing now would
                    // mix with it. Merged once its events have settled (apply_deferred).
                    tracing::debug!(minion = %decision.id, peer = &**from, "deferred: the id's own events are settling");
                    self.deferred.push((from.to_string(), decision));
                    continue;
                }
                match self.replica.merge(&decision, now, max_skew) {
                    Err(skew) => {
                        // Audited once: anti-entropy offers the same version again and again.
                        if self.reported.insert((decision.id.clone(), decision.version.clone())) {
                            self.metrics.decisions_refused.inc();
                            tracing::warn!(minion = %decision.id, peer = &**from, error = %skew, "refused a decision from the future");
                            self.audit_remote(&decision, from, "refuse", "refused", Some(skew.to_string()));
                        }
                    }
                    Ok(MergeOutcome::Duplicate) => {}
                    Ok(MergeOutcome::Superseded { conflict }) => {
                        if let Some(conflict) = conflict {
                            self.audit_conflict(&decision, from, &conflict);
                        }
                        let reason =
                            self.replica.entry(&decision.id).map(|held| format!("holds newer {}", held.version));
                        self.audit_remote(&decision, from, decision.verdict.kind().action(), "superseded", reason);
                    }
                    Ok(MergeOutcome::Apply { conflict }) => match chosen.get(&decision.id) {
                        Some(held) if held.arrival != arrival => later[arrival].push(decision),
                        // Several decisions for one id in one arrival: the newest wins.
                        Some(held) if held.decision.version >= decision.version => {}
                        _ => {
                            let accepted = Accepted { decision, conflict, from: from.clone(), arrival };
                            chosen.insert(accepted.decision.id.clone(), accepted);
                        }
                    },
                }
            }
        }
        let mut batch: Vec<Accepted> = chosen.into_values().collect();
        batch.sort_by(|a, b| a.decision.id.cmp(&b.decision.id));
        let mut n_applied = self.apply_batch(batch, n_arrivals);
        if later.iter().any(|decisions| !decisions.is_empty()) {
            let again = self.apply_arrivals(froms.into_iter().zip(later).collect());
            n_applied.iter_mut().zip(again).for_each(|(n, more)| *n += more);
        }
        n_applied
    }

    /// Applies `batch` (decisions about distinct ids, from `n_arrivals`
    /// arrivals); returns how many of each arrival's were applied.
    fn apply_batch(&mut self, batch: Vec<Accepted>, n_arrivals: usize) -> Vec<u32> {
        let mut n_applied = vec![0; n_arrivals];
        if batch.is_empty() {
            return n_applied;
        }
        let started = std::time::Instant::now();
        let decisions: Vec<Decision> = batch.iter().map(|a| a.decision.clone()).collect();
        if let Err(e) = self.store.journal(&decisions) {
            self.trouble.failed(&self.audit, "state store journal", &e.to_string());
            self.retry.extend(batch.into_iter().map(|a| (a.from.to_string(), a.decision)));
            return n_applied;
        }
        let t_journalled = started.elapsed();
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
        let mut written = Vec::new();
        let mut revoked = false;
        for ((accepted, had_accepted), result) in batch.into_iter().zip(had_accepted).zip(results) {
            let decision = &accepted.decision;
            match result {
                Ok(applied) => {
                    self.echoes.expect(decision.id.as_str(), &applied.changes, now);
                    // What reading the echo would have noted: no pending key
                    // left, and nothing refused in the folders now written.
                    self.pending.remove(&decision.id);
                    if !self.refused.is_empty() {
                        let mut refused = (Folder::Accepted, decision.id.to_string());
                        for folder in Folder::ALL {
                            refused.0 = folder;
                            self.refused.remove(&refused);
                        }
                    }
                    revoked |= had_accepted;
                    written.push((accepted, applied));
                }
                Err(e) => {
                    // Nothing recorded for it: peers still see this node without it.
                    let what = format!("{} for {}", self.pki.root().display(), decision.id);
                    self.trouble.failed(&self.audit, &what, &e.to_string());
                    self.retry.push((accepted.from.to_string(), accepted.decision));
                }
            }
        }
        if written.is_empty() {
            return n_applied;
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
            self.retry.extend(written.into_iter().map(|(a, _)| (a.from.to_string(), a.decision)));
            return n_applied;
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
            self.applied_records(accepted, applied, &mut records);
            self.replica.commit(&accepted.decision);
            n_applied[accepted.arrival] += 1;
        }
        drop(records);
        let t_audited = started.elapsed();
        // Forwarded per peer of origin, which need not get its own back.
        let mut by_peer: Vec<(Arc<str>, Vec<Decision>)> = Vec::new();
        for ((accepted, _), decision) in written.iter().zip(decisions) {
            match by_peer.iter_mut().find(|(from, _)| *from == accepted.from) {
                Some((_, decisions)) => decisions.push(decision),
                None => by_peer.push((accepted.from.clone(), vec![decision])),
            }
        }
        let peers: Vec<&str> = by_peer.iter().map(|(from, _)| &**from).collect();
        let peers = peers.join(",");
        for (from, decisions) in by_peer {
            self.broadcast(Some(&from), decisions);
        }
        // After forwarding: the audit lines are written, the store holds the decisions.
        self.audit.sync();
        tracing::debug!(
            peer = peers,
            n = written.len(),
            journalled_us = t_journalled.as_micros() as u64,
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
        let from: Arc<str> = "journal".into();
        let batch = journal
            .into_iter()
            .filter(|d| self.replica.entry(&d.id).is_none_or(|held| held.version < d.version))
            .map(|decision| Accepted { decision, conflict: None, from: from.clone(), arrival: 0 })
            .collect();
        self.apply_batch(batch, 1);
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
        if !by_peer.is_empty() {
            self.apply_arrivals(by_peer.into_iter().collect());
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
        if !by_peer.is_empty() {
            self.apply_arrivals(by_peer.into_iter().collect());
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

    fn applied_records(&mut self, accepted: &Accepted, applied: &Applied, out: &mut crate::audit::Batch) {
        let decision = &accepted.decision;
        let from = &*accepted.from;
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
