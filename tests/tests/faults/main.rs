//! The fault-injection suite (issue 6): real agent processes on loopback,
//! killed with SIGKILL, partitioned by cuttable relays, starved of disk
//! space, run with skewed clocks and lost inotify events, plus a seeded soak.
//! Every test ends with all folders identical and no decision an operator
//! did not make (no delete, no rollback) anywhere.

/// Key folders that are mounts of their own: refused; pki_dir as one mount: replicates.
mod bind_mounts;
/// Clocks hours ahead and behind; a peer far in the future refused.
mod clock;
/// Shared helpers: folder snapshots, audit queries, convergence.
mod common;
/// Live pushes go twice on a path that loses packets, and are applied once.
mod copies;
/// A peer's decision waits for a salt-key run in progress on the same id.
mod deferral;
/// A full disk (a real size-limited tmpfs) while applying.
mod full_disk;
/// kill -9 in the middle of applying a burst of 5,000 decisions.
mod kill;
/// inotify queue overflow under a burst: the rescan finds everything.
mod overflow;
/// Partitions while all three masters take conflicting decisions.
mod partition;
/// A link a reload stops lets go of what it was fetching.
mod reload;
/// A round left to a joining peer runs once the peer's round is over.
mod rounds;
/// A master whose start takes long answers its peers meanwhile.
mod slow_start;
/// Seeded randomised soak (SOAK_SEED, SOAK_OPS).
mod soak;
/// A peer that takes a Fetch and never answers it holds nothing for long.
mod stalled;
/// A standby off for longer than tombstone_ttl: stale, then `rejoin`.
mod standby;
/// The state folder lost or corrupt: refusal, then `recover --from-peers`.
mod state_loss;
