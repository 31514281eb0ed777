//! salt-keysync: replicates salt-key decisions between SaltStack masters.
#![forbid(unsafe_code)]

pub mod core;
