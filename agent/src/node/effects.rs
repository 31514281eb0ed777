//! The node machine's effects against the real world: the key folders
//! (`disk::pki`), the redb store, the audit log and the peer links.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use keysync_machine::core::merge::Conflict;
use keysync_machine::node::{Applied, Event, Failure, FileToken, Listing, Runtime, StoreWrite};

use crate::core::{Decision, Entry, Folder, MinionId, Slot, Version};
use crate::disk::audit::{AuditLog, Record};
use crate::disk::pki::ahead::ReadAhead;
use crate::disk::pki::{drop_dfn, Owner, Pki};
use crate::disk::store::Store;
use crate::ops::metrics::Metrics;

/// Audit records written with one `write()` once this many are buffered.
const AUDIT_BATCH: usize = 1024;

pub struct Effects {
    pub(super) node: String,
    pub(super) pki: Arc<Pki>,
    /// Key files read ahead where they are not in memory.
    pub(super) ahead: ReadAhead,
    pub(super) store: Arc<Store>,
    pub(super) owner: Owner,
    pub(super) cachedir: PathBuf,
    pub(super) master_id: String,
    pub(super) audit: Arc<AuditLog>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) outgoing: super::outgoing::Channel,
    /// Records told and not written yet: written together at the end of
    /// each input (or every [`AUDIT_BATCH`]), not one `write()` each.
    pub(super) buffered: Vec<Record>,
    /// Observe mode: nothing is written to the key folders or `.dfn`, and
    /// the node's events are logged, not audited (nothing happened).
    pub(super) observe: bool,
    /// Keys of the chunk being applied that its link wrote ahead
    /// (`disk/pki/prestage.rs`), while the node applies that chunk.
    pub(super) prestaged: Option<crate::disk::pki::prestage::Prestaged>,
}

impl Effects {
    /// Counts a failed write for `keysync_write_failures_total` (the machine
    /// retries it; each failed attempt counts).
    fn count_failure<T>(&self, result: Result<T, Failure>) -> Result<T, Failure> {
        if result.is_err() {
            self.metrics.write_failures.inc();
        }
        result
    }

    /// Writes the records told so far (the core loop calls it after every input).
    pub fn write_told(&mut self) {
        if !self.buffered.is_empty() {
            let (n, started) = (self.buffered.len(), Instant::now());
            self.audit.record_all(std::mem::take(&mut self.buffered));
            tracing::debug!(n, audited_us = micros(started), "audited");
        }
    }
}

/// Microseconds since `started`, for the debug log's timings of each step.
fn micros(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
}

impl Runtime for Effects {
    fn read_slot(&mut self, folder: Folder, id: &MinionId) -> Slot {
        self.pki.read_slot(folder, id.as_str())
    }

    fn read_slot_token(&mut self, folder: Folder, id: &MinionId) -> (Slot, Option<FileToken>) {
        self.pki.read_slot_token(folder, id.as_str())
    }

    fn unchanged(&mut self, token: FileToken, id: &MinionId) -> bool {
        self.pki.unchanged(token, id.as_str())
    }

    fn read_soon(&mut self, files: &[(Folder, &str)]) {
        self.ahead.soon(files);
    }

    fn list(&mut self) -> Result<Listing, Failure> {
        let (files, complete) =
            self.pki.list_usable().map_err(|e| Failure::new(format_args!("cannot list the key folders: {e}")))?;
        Ok(Listing { files, complete })
    }

    fn apply(&mut self, decisions: &[&Decision]) -> Vec<Result<Applied, Failure>> {
        if self.observe {
            return decisions.iter().map(|_| Ok(Applied::default())).collect();
        }
        let renamed = || self.prestaged.as_ref().map_or(0, |staged| staged.n_renamed());
        let (started, renamed_before) = (Instant::now(), renamed());
        let results = self.pki.apply_all(decisions, self.prestaged.as_ref());
        tracing::debug!(
            n = decisions.len(),
            renamed_ahead = renamed() - renamed_before,
            written_us = micros(started),
            "applied"
        );
        for _ in results.iter().filter(|r| r.is_err()) {
            self.metrics.write_failures.inc();
        }
        results.into_iter().map(|result| result.map_err(Failure::new)).collect()
    }

    fn sync_folders(&mut self) -> Result<(), Failure> {
        if self.observe {
            return Ok(());
        }
        let started = Instant::now();
        let synced =
            self.pki.sync().map_err(|e| Failure::new(format_args!("syncfs {}: {e}", self.pki.root().display())));
        tracing::debug!(synced_us = micros(started), "synced");
        self.count_failure(synced)
    }

    fn drop_dfn(&mut self) -> Result<bool, Failure> {
        if self.observe {
            return Ok(false);
        }
        drop_dfn(&self.cachedir, &self.master_id, self.owner, &self.pki.trust())
            .map_err(|e| Failure::new(format_args!("cannot drop {}/.dfn: {e}", self.cachedir.display())))
    }

    fn journal(&mut self, decisions: &[Decision]) -> Result<(), Failure> {
        let started = Instant::now();
        let journalled = self.store.journal(decisions).map_err(Failure::new);
        tracing::debug!(n = decisions.len(), journalled_us = micros(started), "journalled");
        self.count_failure(journalled)
    }

    fn record(&mut self, write: &StoreWrite<'_>) -> Result<(), Failure> {
        let started = Instant::now();
        let recorded = self.store.record_at(write, &self.node, Some(&self.audit.head())).map_err(Failure::new);
        tracing::debug!(n = write.decisions.len(), recorded_us = micros(started), "recorded");
        self.count_failure(recorded)
    }

    fn load(&mut self, ids: &[MinionId]) -> Result<Vec<Decision>, Failure> {
        self.store.get(ids).map_err(Failure::new)
    }

    fn load_cold(&mut self, ids: &[MinionId]) -> Result<Vec<(MinionId, Entry)>, Failure> {
        self.store.cold(ids).map_err(Failure::new)
    }

    fn cold_in(&mut self, buckets: &[u32]) -> Result<Vec<(MinionId, Version)>, Failure> {
        self.store.cold_in(buckets).map_err(Failure::new)
    }

    fn compact(&mut self, before_ms: u64, max: usize) -> Result<Vec<(MinionId, Version)>, Failure> {
        let compacted = self.store.compact_versions(before_ms, max).map_err(Failure::new);
        self.count_failure(compacted)
    }

    fn was_told(&mut self, conflict: &Conflict) -> bool {
        // Records written before a stop are in the file; the rotated ones
        // would be days older than any conflict still untold.
        crate::disk::audit::read_all(self.audit.path())
            .is_ok_and(|records| records.iter().any(|r| super::tell::tells(r, conflict)))
    }

    fn audit(&mut self, event: Event) {
        super::tell::log_and_count(&event, &self.metrics);
        self.metrics.refused.count_event(&event);
        if self.observe {
            return;
        }
        if let Some(record) = super::tell::record(&event, &self.node) {
            self.buffered.push(record);
            if self.buffered.len() >= AUDIT_BATCH {
                self.write_told();
            }
        }
    }

    fn flush_audit(&mut self) {
        self.write_told();
        self.audit.sync();
    }

    fn send(&mut self, except: Option<&keysync_machine::PeerName>, decisions: Vec<Decision>) {
        if decisions.is_empty() {
            return;
        }
        self.outgoing.send(except.cloned(), decisions);
    }
}
