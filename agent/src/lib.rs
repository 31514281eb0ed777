//! salt-keysync: replicates salt-key decisions between SaltStack masters.
//!
//! `core` is the sans-IO replication core; everything else is the driver
//! around it (see ARCHITECTURE.md for the data flow and the invariants).
#![forbid(unsafe_code)]

pub mod agent;
pub mod audit;
pub mod board;
pub mod config;
pub mod control;
pub mod core;
pub mod fault;
pub mod health;
pub mod links;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod notify;
pub mod peers;
pub mod perms;
pub mod pki;
pub mod recover;
pub mod reload;
pub mod rpc;
pub mod salt_master;
pub mod state_guard;
pub mod status;
pub mod store;
pub mod watcher;
pub mod wire;
