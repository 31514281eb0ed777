//! The sans-IO side of salt-keysync: what a node decides, with no I/O.
//!
//! Architecture invariant: this crate depends on no tokio, tonic, notify or
//! redb and reads no clock (time comes in with the inputs), so cargo, not a
//! reviewer, keeps I/O out of it. The agent crate (`salt-keysync`) executes
//! what it decides against the real disk, store and network; the simulation
//! in `tests/sim` executes it against a simulated world.
#![forbid(unsafe_code)]

pub mod core;
pub mod link;
pub mod node;
pub mod peer;

pub use peer::PeerName;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
