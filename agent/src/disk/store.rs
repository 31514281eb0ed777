//! The agent's state store under `state_dir`: the redb store of
//! `keysync-store` (decisions, journal, claims, tombstones, held deletes:
//! what the node machine commits and loads), opened only once its file is
//! found to be the agent's own (`format::own_and_narrow`), with the audit
//! log's head noted at each commit the core makes (`audit_guard.rs`).

use std::ops::Deref;
use std::path::Path;

use keysync_machine::node::StoreWrite;

use crate::disk::audit::AuditHead;

pub mod format;

pub use keysync_store::{Peek, StoreError, FILE_NAME};

/// The store, read and written through [`keysync_store::Store`]'s methods.
pub struct Store(keysync_store::Store);

impl Deref for Store {
    type Target = keysync_store::Store;

    fn deref(&self) -> &keysync_store::Store {
        &self.0
    }
}

impl Store {
    /// Opens the store of `node` in `state_dir`, or makes it (it starts
    /// afresh now); a store file wider than 0600 is narrowed first, and one
    /// of another user refused.
    pub fn open(state_dir: &Path, node: &str) -> Result<Store, StoreError> {
        let path = state_dir.join(FILE_NAME);
        if let Some(mode) = format::own_and_narrow(&path).map_err(StoreError::Foreign)? {
            tracing::warn!(path = %path.display(), mode = format!("{mode:04o}"), "the state store was wider than 0600: narrowed");
        }
        keysync_store::Store::open(state_dir, node, crate::node::wall_ms()).map(Store)
    }

    /// A store in memory, gone when the agent stops: observe mode keeps no
    /// state, so the first start in normal mode afterwards is a first start.
    pub fn in_memory(node: &str) -> Result<Store, StoreError> {
        keysync_store::Store::in_memory(node, crate::node::wall_ms()).map(Store)
    }

    /// A read-only look at the store in `state_dir`.
    pub fn peek(state_dir: &Path) -> Result<Peek, StoreError> {
        keysync_store::Store::peek(state_dir)
    }

    /// One commit ([`keysync_store::Store::record`]), noting in it where the
    /// audit log's chain ends now, so that records removed while the agent
    /// is stopped are noticed at its next start.
    pub fn record_at(&self, write: &StoreWrite<'_>, node: &str, head: Option<&AuditHead>) -> Result<(), StoreError> {
        let head = head.map(AuditHead::to_string);
        self.0.record_noting(write, node, head.as_deref())
    }

    /// Where the audit log's chain ended at the last commit that noted it.
    pub fn audit_head(&self) -> Result<Option<AuditHead>, StoreError> {
        Ok(self.0.audit_head_text()?.and_then(|text| text.parse().ok()))
    }

    /// Notes where the audit log's chain ends (at a clean stop).
    pub fn set_audit_head(&self, head: &AuditHead) -> Result<(), StoreError> {
        self.0.set_audit_head_text(&head.to_string())
    }
}
