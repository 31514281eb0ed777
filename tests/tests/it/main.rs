//! The integration tests of salt-keysync, one binary (ripgrep style).

/// The real binary as separate processes: CLI errors, `run --config` on three agents.
mod binary;
/// What the packages ship: man pages and completions from `generate`,
/// examples in `--help`, the example config's documented defaults.
mod packaging;
/// In-process three-agent clusters over real mTLS: accept, reject and delete
/// in both Salt patterns, restarts, transitive propagation, partitions.
mod replication;
/// Real `salt-key` from Salt 3008.3 and 3006.28 driving three agent processes.
mod salt_key;
