//! salt-keysync: replicates salt-key decisions between SaltStack masters.
//!
//! `core` is the sans-IO replication core; everything else is the driver
//! around it (see ARCHITECTURE.md for the data flow and the invariants).
#![forbid(unsafe_code)]

pub mod agent;
pub mod audit;
pub mod config;
pub mod core;
pub mod fault;
pub mod node;
pub mod peers;
pub mod pki;
pub mod recover;
pub mod rpc;
pub mod salt_master;
pub mod state_guard;
pub mod store;
pub mod watcher;
pub mod wire;
