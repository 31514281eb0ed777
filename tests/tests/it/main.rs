//! The integration tests of salt-keysync, one binary (ripgrep style).

/// The real binary as separate processes: CLI errors, `run --config` on three agents.
mod binary;
/// In-process three-agent clusters over real mTLS: accept, reject and delete
/// in both Salt patterns, restarts, transitive propagation, partitions.
mod replication;
/// Real `salt-key` from Salt 3008.3 and 3006.28 driving three agent processes.
mod salt_key;
/// Issue 4: hostile key files, hostile peer messages and strangers at the TLS
/// door are refused, audited once each, and never reach a peer.
mod security;
/// Issue 4: start-up refuses too-open paths and masters it cannot serve.
mod startup;
