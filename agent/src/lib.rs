//! salt-keysync: replicates salt-key decisions between SaltStack masters.
//!
//! `core` (the `keysync-machine` crate) decides; this crate carries out what
//! it decides against the world, grouped by what it touches: `disk`, `net`
//! (peers), `ops` (the operator and systemd while running) and `cli` (the
//! other subcommands). `node` is the task that owns the core; `agent` wires
//! everything together. See ARCHITECTURE.md for the data flow and the
//! invariants.
#![forbid(unsafe_code)]

pub use keysync_machine::core;

pub mod agent;
pub mod cli;
pub mod config;
pub mod disk;
pub mod fault;
pub mod net;
pub mod node;
pub mod ops;
pub mod setup;
pub mod text;
