//! Accepts on a master while it serves a join: A holds `n_serve_join`
//! decided keys and B took them from A (untimed); single `salt-key -a` on A,
//! dated on B by inotify as in `latency.rs`, first with nothing else going
//! on, then while C, empty, joins A and B (A and B answer its Diffs and
//! Fetches). What a join's serving costs the accepts made meanwhile: the
//! agent's core, which writes, commits and answers the joiner's requests,
//! must not keep the async workers that carry the accept to B waiting.

use std::time::{Duration, Instant};

use anyhow::bail;
use keysync_tests::salt_ops::{move_key, SaltLine};

use crate::cluster::{seed_decided, BenchCluster, REJECTED_EVERY};
use crate::join::{join_one, JoinWatch, SEED_PREFIX};
use crate::procfs::memory;
use crate::report::{OpRow, PeakRow};
use crate::watch::{Final, PeerWatch};
use crate::Settings;

/// Longest wait for one accept to reach B before it counts as missed.
const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a join may take.
const JOIN_TIMEOUT: Duration = Duration::from_secs(300);
/// Between one accept reaching B and the next: accepts at a steady pace
/// through the join, not a burst of their own.
const GAP: Duration = Duration::from_millis(10);
/// Accepts during the join, at most (pending keys written beforehand).
const MAX_DURING: usize = 5_000;

#[derive(Debug, serde::Serialize)]
pub struct ServeJoinRow {
    /// Decided keys C takes from A and B.
    pub n_keys: usize,
    /// Accepts on A with nothing else going on (C not started), dated on B.
    pub quiet: OpRow,
    /// Accepts on A from C's start until C held every key, dated on B.
    pub during_join: OpRow,
    /// From C's start until it held every key.
    pub join_secs: f64,
    /// The three agents right after C's join: A's peak includes its first
    /// start, B's its own join.
    pub agents: Vec<PeakRow>,
}

pub fn run(settings: &Settings, keys: &[String]) -> anyhow::Result<ServeJoinRow> {
    let mut cluster = BenchCluster::new(settings, "serve-join")?;
    let n = settings.n_serve_join;
    let a = cluster.pki(0).to_path_buf();
    seed_decided(&a, SEED_PREFIX, n, keys)?;
    let n_rejected = n.div_ceil(REJECTED_EVERY);
    let want = (n - n_rejected, n_rejected);
    cluster.start(0)?;
    join_one(&mut cluster, 1, want)?;

    let n_quiet = settings.serve_join_quiet_ops;
    let ids: Vec<String> = (0..n_quiet + MAX_DURING).map(|i| format!("srv{i:06}")).collect();
    crate::latency::write_pending(&cluster, std::slice::from_ref(&a), &ids, keys)?;
    let watch = PeerWatch::new(&[cluster.pki(1)])?;
    let mut next = ids.iter().enumerate();
    let mut accept = || -> Vec<Option<Duration>> {
        let Some((i, id)) = next.next() else { return Vec::new() };
        watch.drain();
        let line = [SaltLine::S3006, SaltLine::S3008][i % 2];
        move_key(line, &a, id, "minions");
        let t0 = Instant::now();
        let reached =
            watch.wait_final(id, &Final::In("minions", keys[i % keys.len()].as_bytes().to_vec()), t0, OP_TIMEOUT);
        std::thread::sleep(GAP);
        reached
    };

    let quiet: Vec<Option<Duration>> = (0..n_quiet).flat_map(|_| accept()).collect();

    let mut arrivals = JoinWatch::new(cluster.pki(2), SEED_PREFIX, want)?;
    let t0 = Instant::now();
    cluster.start(2)?;
    let mut during = Vec::new();
    let joined = loop {
        if let Some(done) = arrivals.poll(Duration::ZERO)? {
            break done;
        }
        let reached = accept();
        if reached.is_empty() {
            // Every pending key accepted: the join is waited for alone.
            if let Some(done) = arrivals.poll(Duration::from_millis(200))? {
                break done;
            }
        }
        during.extend(reached);
        if t0.elapsed() > JOIN_TIMEOUT {
            bail!("{} holds {:?} keys after {JOIN_TIMEOUT:?}, not {want:?}", cluster.files[2].name, arrivals.held());
        }
    };
    let agents = (0..3).map(|idx| peak(&cluster, idx)).collect::<anyhow::Result<_>>()?;
    cluster.stop()?;
    Ok(ServeJoinRow {
        n_keys: n,
        quiet: OpRow::new("accept", "3006+3008", quiet),
        during_join: OpRow::new("accept", "3006+3008", during),
        join_secs: joined.saturating_duration_since(t0).as_secs_f64(),
        agents,
    })
}

/// Agent `idx`'s memory now and at its peak.
fn peak(cluster: &BenchCluster, idx: usize) -> anyhow::Result<PeakRow> {
    let Some(pid) = cluster.pid(idx) else { bail!("{} is not running", cluster.files[idx].name) };
    let memory = memory(pid)?;
    Ok(PeakRow { node: cluster.files[idx].name.clone(), rss_mib: memory.rss_mib, peak_rss_mib: memory.peak_rss_mib })
}
