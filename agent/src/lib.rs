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

/// What `salt-keysync --version` prints after the name: this build's
/// version (the package's) and the replication protocols it speaks, e.g.
/// `0.2.0 (protocol 2, oldest peer protocol 1)`.
pub fn version_line() -> &'static str {
    static LINE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "{} (protocol {}, oldest peer protocol {})",
            env!("CARGO_PKG_VERSION"),
            keysync_proto::PROTOCOL_VERSION,
            keysync_proto::MIN_PROTOCOL_VERSION
        )
    });
    LINE.as_str()
}
