//! The `salt-keysync` binary.
fn main() {}
