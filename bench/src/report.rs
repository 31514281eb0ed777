//! The benchmark's figures: percentiles, the targets next to them,
//! a table for people and a JSON summary for machines.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::Settings;

#[derive(Debug, Serialize)]
pub struct Report {
    pub settings: Settings,
    /// `/proc/loadavg` before and after: the machine may be shared.
    pub load_before: String,
    pub load_after: String,
    pub wall_secs: f64,
    pub ops: Vec<OpRow>,
    pub bulk: Vec<BulkRow>,
    /// `null` when skipped (`--join 0`), and `agents` empty.
    pub join: Option<JoinRow>,
    /// The three agents after the join and idling.
    pub agents: Vec<AgentRow>,
    /// `null` when skipped (`--adopt 0`).
    pub adopt: Option<AdoptRow>,
    /// `null` when skipped (`--flood 0`).
    pub flood: Option<crate::flood::FloodRow>,
    /// `null` when skipped (`--hostile 0`).
    pub hostile: Option<crate::hostile::HostileRow>,
    /// `null` when skipped (`--serve-join 0`).
    pub serve_join: Option<crate::serve_join::ServeJoinRow>,
}

/// Latency of one kind of operation: one sample per operation and peer.
#[derive(Debug, Serialize)]
pub struct OpRow {
    pub kind: String,
    pub salt: String,
    pub n_samples: usize,
    /// Samples that did not reach the final state within the timeout.
    pub n_missed: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl OpRow {
    pub fn new(kind: &str, salt: &str, samples: Vec<Option<Duration>>) -> OpRow {
        let n_samples = samples.len();
        let mut ms: Vec<f64> = samples.into_iter().flatten().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        OpRow {
            kind: kind.into(),
            salt: salt.into(),
            n_samples,
            n_missed: n_samples - ms.len(),
            p50_ms: percentile(&ms, 0.50),
            p99_ms: percentile(&ms, 0.99),
            max_ms: ms.last().copied().unwrap_or(f64::NAN),
        }
    }

    /// Targets: accept/reject p50 ≤ 5 ms and p99 ≤ 20 ms; delete p99 ≤ 100 ms.
    pub fn meets_target(&self) -> bool {
        self.n_missed == 0
            && match self.kind.as_str() {
                "delete" => self.p99_ms <= 100.0,
                _ => self.p50_ms <= 5.0 && self.p99_ms <= 20.0,
            }
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[derive(Debug, Serialize)]
pub struct BulkRow {
    pub salt: String,
    pub n_keys: usize,
    /// How long the burst of renames took on A.
    pub burst_ms: f64,
    /// From the last rename on A until B, and C, held every key (`null`: never).
    pub per_peer_ms: Vec<Option<f64>>,
    pub all_ms: Option<f64>,
}

impl BulkRow {
    pub fn new(salt: &str, n_keys: usize, burst: Duration, per_peer: Vec<Option<Duration>>) -> BulkRow {
        let per_peer_ms: Vec<Option<f64>> = per_peer.iter().map(|d| d.map(|d| d.as_secs_f64() * 1e3)).collect();
        let all_ms = per_peer_ms.iter().try_fold(0f64, |max, ms| ms.map(|ms| max.max(ms)));
        BulkRow { salt: salt.into(), n_keys, burst_ms: burst.as_secs_f64() * 1e3, per_peer_ms, all_ms }
    }
}

#[derive(Debug, Serialize)]
pub struct JoinRow {
    pub n_keys: usize,
    /// Writing the keys into A's folders before its agent's first start.
    pub seed_secs: f64,
    /// A's first start: reading and recording every key.
    pub first_start_secs: f64,
    /// B, empty, joining A alone.
    pub join_one_peer_secs: f64,
    /// C, empty, joining A and B: the figure with a target.
    pub join_two_peers_secs: f64,
    pub rsync_secs: f64,
    /// join_two_peers_secs / rsync_secs.
    pub ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct AgentRow {
    pub node: String,
    pub rss_mib: f64,
    /// VmHWM: the resident set's high-water mark since the agent started
    /// (its join, or A's first start, included).
    pub peak_rss_mib: f64,
    pub idle_cpu_secs: f64,
    pub idle_secs: f64,
    /// Its links' sessions that failed on a timeout (a handshake not
    /// completed, keep-alive): see [`crate::cluster::BenchCluster::link_timeouts`].
    pub link_timeouts: usize,
}

/// An agent's resident memory now and at its peak (VmHWM).
#[derive(Debug, Serialize)]
pub struct PeakRow {
    pub node: String,
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
}

/// First contact on three masters that already agree (see `adopt.rs`).
#[derive(Debug, Serialize)]
pub struct AdoptRow {
    /// Decided keys each master holds (the same on all three).
    pub n_keys: usize,
    /// Writing them into the three masters' folders, and `sync` (untimed).
    pub seed_secs: f64,
    /// The page cache was dropped before the agents started (`--adopt-cold`).
    pub cold: bool,
    /// From starting the three agents until they were quiet: the figure with a target.
    pub quiet_secs: f64,
    /// From starting them until every link was seen up (digests compared).
    pub links_up_secs: f64,
    /// What "quiet" means: at most `quiet_ticks` clock ticks of CPU between
    /// the three agents over `quiet_window_secs`.
    pub quiet_window_secs: f64,
    pub quiet_ticks: u64,
    /// Key files on the three masters, compared before and after.
    pub files_checked: usize,
    /// Key files created, removed, or with another inode or mtime: must be 0.
    pub files_written: usize,
    /// Key files whose ctime alone changed (mode, owner or link count).
    pub files_touched: usize,
    pub agents: Vec<AdoptAgentRow>,
}

#[derive(Debug, Serialize)]
pub struct AdoptAgentRow {
    pub node: String,
    /// From starting the agents until this one logged its start (its first
    /// start's reading and recording of every key done).
    pub started_secs: f64,
    /// CPU time (user + system) from its start until the agents were quiet.
    pub cpu_secs: f64,
    /// Lines in its audit log.
    pub audit_records: usize,
    pub files_written: usize,
    pub rss_mib: f64,
    /// VmHWM: the resident set's high-water mark since the agent started.
    pub peak_rss_mib: f64,
    /// When the highest resident set sampled (every 100 ms) was seen: before
    /// `started_secs`, the peak is the first start's reading of the folders.
    pub peak_sampled_at_secs: f64,
    /// Its links' sessions that failed on a timeout: must be 0.
    pub link_timeouts: usize,
}

/// Target: an agent's resident memory at its PEAK, at most 64 MiB.
pub const PEAK_RSS_TARGET_MIB: f64 = 64.0;

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string()
}

fn mark(met: bool) -> &'static str {
    if met {
        "yes"
    } else {
        "NO"
    }
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the report serializes")
    }

    /// The human-readable table, with each target.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let s = &self.settings;
        let _ = writeln!(out, "salt-keysync benchmark: 3 agents on loopback (mTLS), {:.0} s wall", self.wall_secs);
        let _ = writeln!(out, "load average before: {}  after: {}", self.load_before, self.load_after);
        let _ = writeln!(out, "\nsingle operations on A, final file state on B and C ({} ops of each kind)", s.n_ops);
        let _ = writeln!(
            out,
            "{:<8} {:<10} {:>8} {:>7} {:>9} {:>9} {:>9}  target",
            "op", "salt", "samples", "missed", "p50 ms", "p99 ms", "max ms"
        );
        for row in &self.ops {
            let target = if row.kind == "delete" { "p99<=100" } else { "p50<=5 p99<=20" };
            let _ = writeln!(
                out,
                "{:<8} {:<10} {:>8} {:>7} {:>9.2} {:>9.2} {:>9.2}  {target}: {}",
                row.kind,
                row.salt,
                row.n_samples,
                row.n_missed,
                row.p50_ms,
                row.p99_ms,
                row.max_ms,
                mark(row.meets_target())
            );
        }
        let _ = writeln!(out, "\nbulk accept (salt-key -A): from the last rename on A until B and C hold every key");
        for row in &self.bulk {
            let peers: Vec<String> =
                row.per_peer_ms.iter().map(|ms| ms.map_or("never".into(), |ms| format!("{ms:.0} ms"))).collect();
            let all = row.all_ms.map_or("never".into(), |ms| format!("{ms:.0} ms"));
            let met = row.all_ms.is_some_and(|ms| ms <= 1000.0);
            let _ = writeln!(
                out,
                "  {} keys, Salt {}: burst {:.0} ms on A; B {}, C {}; all {all}  target <=1 s: {}",
                row.n_keys,
                row.salt,
                row.burst_ms,
                peers[0],
                peers[1],
                mark(met)
            );
        }
        if let Some(j) = &self.join {
            let _ = writeln!(out, "\njoin of an empty master, {} decided keys", j.n_keys);
            let _ = writeln!(
                out,
                "  seeding A's folders {:.1} s; A's first start {:.1} s",
                j.seed_secs, j.first_start_secs
            );
            let _ = writeln!(out, "  B joining A:         {:.2} s", j.join_one_peer_secs);
            let _ = writeln!(
                out,
                "  C joining A and B:   {:.2} s  target <=10 s: {}",
                j.join_two_peers_secs,
                mark(j.join_two_peers_secs <= 10.0)
            );
            let _ = writeln!(out, "  rsync -a, same folders: {:.2} s  (join / rsync = {:.1})", j.rsync_secs, j.ratio);
            let _ = writeln!(out, "\nagents holding {} keys, then idle {:.0} s", j.n_keys, s.idle.as_secs_f64());
            for a in &self.agents {
                let _ = writeln!(
                    out,
                    "  {:<9} RSS {:>6.1} MiB, peak {:>6.1} MiB  target peak <={PEAK_RSS_TARGET_MIB}: {}   idle CPU {:.3} s ({:.2} %)   link timeouts {} target 0: {}",
                    a.node,
                    a.rss_mib,
                    a.peak_rss_mib,
                    mark(a.peak_rss_mib <= PEAK_RSS_TARGET_MIB),
                    a.idle_cpu_secs,
                    100.0 * a.idle_cpu_secs / a.idle_secs,
                    a.link_timeouts,
                    mark(a.link_timeouts == 0)
                );
            }
        }
        if let Some(a) = &self.adopt {
            let _ = writeln!(
                out,
                "\nfirst contact: 3 masters already agreeing on {} keys, agents started together",
                a.n_keys
            );
            let cold = if a.cold { "; then the page cache dropped: the key files on the disk only" } else { "" };
            let _ = writeln!(out, "  seeding the three masters' folders {:.1} s (untimed){cold}", a.seed_secs);
            let _ = writeln!(
                out,
                "  quiet after {:.2} s (links up after {:.2} s; quiet: <= {} CPU ticks between the agents over {:.0} s)  target <=10 s: {}",
                a.quiet_secs,
                a.links_up_secs,
                a.quiet_ticks,
                a.quiet_window_secs,
                mark(a.quiet_secs <= 10.0)
            );
            let _ = writeln!(
                out,
                "  key files written: {} of {} (only ctime changed: {})  target 0: {}",
                a.files_written,
                a.files_checked,
                a.files_touched,
                mark(a.files_written == 0)
            );
            for g in &a.agents {
                let _ = writeln!(
                    out,
                    "  {:<9} started {:>5.2} s  CPU {:>5.2} s  audit records {:>5}  RSS {:>6.1} MiB, peak {:>6.1} MiB (near {:.1} s)  target peak <={PEAK_RSS_TARGET_MIB}: {}  link timeouts {} target 0: {}",
                    g.node,
                    g.started_secs,
                    g.cpu_secs,
                    g.audit_records,
                    g.rss_mib,
                    g.peak_rss_mib,
                    g.peak_sampled_at_secs,
                    mark(g.peak_rss_mib <= PEAK_RSS_TARGET_MIB),
                    g.link_timeouts,
                    mark(g.link_timeouts == 0)
                );
            }
        }
        if let Some(f) = &self.flood {
            let _ = writeln!(
                out,
                "\nflood: one peer pushing {} x {} deletes of ids the master never held, at once, to a lone agent",
                f.pushes, f.ids_per_push
            );
            let _ = writeln!(
                out,
                "  {:.1} s; acknowledged {} received, {} applied; {} pushes refused (a peer may have {} open at once) and sent again; audit +{} lines; store {} -> {} bytes",
                f.secs,
                f.received,
                f.applied,
                f.refused,
                keysync_server::PUSH_STREAMS_PER_PEER,
                f.audit_lines_added,
                f.store_before_bytes,
                f.store_after_bytes
            );
            let _ = writeln!(
                out,
                "  agent memory {:.1} MiB before, peak {:.1} MiB, {:.1} MiB after  target peak <={:.0} MiB: {}",
                f.rss_before_mib,
                f.peak_rss_mib,
                f.rss_after_mib,
                PEAK_RSS_TARGET_MIB,
                mark(f.peak_rss_mib <= PEAK_RSS_TARGET_MIB)
            );
        }
        if let Some(h) = &self.hostile {
            let _ = writeln!(
                out,
                "\nhostile: master-b's certificate against a lone agent holding {} keys, {:.1} s: {} Fetch streams never read ({} more refused); a fake master-b answering {} Diffs with {} summaries and {} Fetches with {} decisions nobody asked for",
                h.keys, h.secs, h.stalled, h.refused, h.diffs_served, h.diff_summaries, h.fetches_served, h.fetch_decisions
            );
            let _ = writeln!(
                out,
                "  agent memory {:.1} MiB before, peak {:.1} MiB, {:.1} MiB after  target peak <={:.0} MiB: {}",
                h.rss_before_mib,
                h.peak_rss_mib,
                h.rss_after_mib,
                PEAK_RSS_TARGET_MIB,
                mark(h.peak_rss_mib <= PEAK_RSS_TARGET_MIB)
            );
            let _ = writeln!(
                out,
                "  audit +{} lines, +{} bytes: {:.0} bytes a minute  target <=1 MB a minute: {}",
                h.audit_lines_added,
                h.audit_bytes_added,
                h.audit_bytes_per_minute,
                mark(h.audit_bytes_per_minute <= 1_000_000.0)
            );
        }
        if let Some(j) = &self.serve_join {
            let _ = writeln!(
                out,
                "\naccepts on A (both Salt lines, one at a time), final file on B, while A and B serve an empty C joining with {} keys",
                j.n_keys
            );
            for (when, row) in
                [("before C starts", &j.quiet), (&*format!("during C's join, {:.2} s", j.join_secs), &j.during_join)]
            {
                let _ = writeln!(
                    out,
                    "  {when:<27} {:>5} samples, {} missed: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms  target p50<=5 p99<=20: {}",
                    row.n_samples,
                    row.n_missed,
                    row.p50_ms,
                    row.p99_ms,
                    row.max_ms,
                    mark(row.meets_target())
                );
            }
            for a in &j.agents {
                let _ = writeln!(
                    out,
                    "  {:<9} RSS {:>6.1} MiB, peak {:>6.1} MiB  target peak <={PEAK_RSS_TARGET_MIB}: {}",
                    a.node,
                    a.rss_mib,
                    a.peak_rss_mib,
                    mark(a.peak_rss_mib <= PEAK_RSS_TARGET_MIB)
                );
            }
        }
        out
    }
}
