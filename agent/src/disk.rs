//! Everything the agent reads or writes on the local disk: the master's key
//! folders (`pki`), the state store, the marker tying them together, the
//! audit log, the inotify watcher, permission checks, and the master's
//! config, settings and version.

pub mod accept;
pub mod audit;
pub mod audit_guard;
pub mod handover;
pub mod health;
pub mod perms;
pub mod pki;
pub mod salt_master;
pub mod salt_version;
pub mod state_guard;
pub mod store;
pub mod watcher;
