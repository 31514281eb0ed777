//! The replication core: pure types and state machines, no I/O.
//!
//! Architecture invariant: nothing under `core/` imports tokio, tonic,
//! notify or std::fs. The node machine (`node/`) is built from these parts;
//! the agent carries out what the machine decides, and the seeded
//! simulation (`tests/sim`) drives the very same machine.

pub mod causal;
pub mod claims;
pub mod decision;
pub mod digest;
pub mod echo;
pub mod id;
pub mod keyfile;
pub mod merge;
pub mod observe;
pub mod replica;
pub mod settle;
pub mod version;

pub use causal::{Context, Seen};
pub use decision::{Decision, Entry, Fingerprint, PublicKey, Relays, Verdict, VerdictKind};
pub use id::MinionId;
pub use observe::{FileToken, Folder, Reading, Slot, Slots};
pub use version::Version;
