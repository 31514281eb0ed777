//! The salt-keysync benchmark: three real agent processes on loopback with
//! mTLS, Salt-style key operations on one master, inotify on the other two,
//! and the performance targets (latency, bulk, join versus `rsync -a`, first
//! contact on masters that already agree, memory at its peak, idle CPU,
//! accepts while a master serves a join).
//! `main.rs` is the command line; `tests/reduced.rs` runs it small.
// Denied, not forbidden: `wan/tun.rs` alone allows it, for the TUNSETIFF ioctl.
#![deny(unsafe_code)]

pub mod adopt;
pub mod cluster;
pub mod flood;
pub mod hostile;
pub mod join;
pub mod latency;
pub mod procfs;
pub mod report;
pub mod serve_join;
pub mod wan;
pub mod watch;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use report::Report;

/// How much work each part of the benchmark does.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Settings {
    /// Operations of each kind (accept, reject, delete), half with each Salt line's pattern.
    pub n_ops: usize,
    /// Pending keys accepted in one burst (once per Salt line).
    pub n_bulk: usize,
    /// Decided keys the two peers hold when the empty master joins (0: no join).
    pub n_join: usize,
    /// Decided keys three masters already agree on when their agents first
    /// start together (0: no adoption).
    pub n_adopt: usize,
    /// The adoption's key files dropped from memory before the agents start
    /// (root: `/proc/sys/vm/drop_caches`), as after a reboot.
    pub adopt_cold: bool,
    /// Idle time over which the agents' CPU use is measured.
    pub idle: Duration,
    /// Agents' log filter (`SALT_KEYSYNC_LOG`).
    pub log_filter: String,
    /// Keeps the temporary folders (agents' logs, audit logs) for a look afterwards.
    pub keep: Option<PathBuf>,
    /// How each agent sees its folders (see [`cluster::Layout`]).
    pub layout: cluster::Layout,
    /// Runs the agents with the blast-radius guard on (its default
    /// settings). Off by default: the figures are of the replication path.
    /// (The latency phase deletes rejected keys, which the guard never
    /// judges; the join and the bulk delete nothing.)
    pub guard: bool,
    /// Deletes of made-up ids in each of `flood_pushes` concurrent pushes
    /// from one peer to a lone agent (0: no flood).
    pub n_flood: usize,
    pub flood_pushes: usize,
    /// Decided keys of the lone agent a compromised master attacks (0: no
    /// attack; see `hostile.rs`), for how long, and the size of the fake
    /// peer's Diff and Fetch answers.
    pub n_hostile_keys: usize,
    pub hostile_for: Duration,
    pub hostile_diff: usize,
    pub hostile_fetch: usize,
    /// Decided keys an empty master C takes from A and B while accepts on A
    /// are timed (0: skip), and the accepts timed before C starts.
    pub n_serve_join: usize,
    pub serve_join_quiet_ops: usize,
}

impl Settings {
    /// The full benchmark of issue 5: a few minutes.
    pub fn full() -> Settings {
        Settings {
            n_ops: 1000,
            n_bulk: 10_000,
            n_join: 100_000,
            n_adopt: 100_000,
            adopt_cold: false,
            idle: Duration::from_secs(60),
            log_filter: "info".into(),
            keep: None,
            guard: false,
            layout: cluster::Layout::Plain,
            n_flood: 25_000,
            flood_pushes: 20,
            n_hostile_keys: 5_000,
            hostile_for: Duration::from_secs(30),
            hostile_diff: 4_000_000,
            hostile_fetch: 480_000,
            n_serve_join: 100_000,
            serve_join_quiet_ops: 200,
        }
    }

    /// The reduced form CI runs: seconds, sane output, no targets.
    pub fn quick() -> Settings {
        Settings {
            n_ops: 20,
            n_bulk: 200,
            n_join: 2_000,
            n_adopt: 2_000,
            idle: Duration::from_secs(3),
            n_flood: 2_000,
            flood_pushes: 20,
            // Answers larger than the client's HTTP/2 windows, so they stall.
            n_hostile_keys: 5_000,
            hostile_for: Duration::from_secs(5),
            hostile_diff: 100_000,
            hostile_fetch: 20_000,
            n_serve_join: 2_000,
            serve_join_quiet_ops: 20,
            ..Settings::full()
        }
    }
}

/// Runs every part of the benchmark and returns its report.
pub fn run(settings: &Settings) -> anyhow::Result<Report> {
    let started = Instant::now();
    let load_before = report::load_average();
    let keys = cluster::key_pool(256);
    // `--ops 0 --bulk 0` leaves the live figures out, `--join 0` the join and
    // `--adopt 0` the adoption: each can run alone (for profiling it).
    let live = if settings.n_ops + settings.n_bulk > 0 {
        latency::run(settings, &keys)?
    } else {
        latency::Live { ops: Vec::new(), bulk: Vec::new() }
    };
    let join = if settings.n_join > 0 { Some(join::run(settings, &keys)?) } else { None };
    let adopt = if settings.n_adopt > 0 { Some(adopt::run(settings, &keys)?) } else { None };
    let flood = if settings.n_flood > 0 && settings.flood_pushes > 0 { Some(flood::run(settings)?) } else { None };
    let hostile = if settings.n_hostile_keys > 0 { Some(hostile::run(settings)?) } else { None };
    let serve_join = if settings.n_serve_join > 0 { Some(serve_join::run(settings, &keys)?) } else { None };
    let (join, agents) = join.map_or((None, Vec::new()), |j| (Some(j.join), j.agents));
    Ok(Report {
        settings: settings.clone(),
        load_before,
        load_after: report::load_average(),
        wall_secs: started.elapsed().as_secs_f64(),
        ops: live.ops,
        bulk: live.bulk,
        join,
        agents,
        adopt,
        flood,
        hostile,
        serve_join,
    })
}

/// The benchmark's inotify watches ask for what the agent's do: changes and
/// files closed after writing, never opens and reads (the agents read every
/// key they are told of; had the benchmark to be woken for each, it would
/// take CPU from the agents it times).
pub(crate) fn watch_config() -> notify::Config {
    notify::Config::default().with_event_kinds(salt_keysync::disk::watcher::WATCHED)
}
