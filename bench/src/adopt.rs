//! Adopt (first contact on an existing site): three masters whose folders
//! already agree on `n_adopt` decided keys (one in twenty rejected), their
//! agents started together for the first time. Measured: the seconds until
//! all three are quiet, how many key files were written (none may be), and
//! each agent's CPU time, audit records and peak resident memory.
//!
//! "Quiet" is read from the kernel, not from the agents' own account: every
//! agent has compared digests with both peers (its `status` shows both links
//! up, which a link is only after its first anti-entropy round), and from a
//! moment on the three agents' CPU time (utime + stime, `/proc/PID/stat`)
//! advanced by at most [`QUIET_TICKS`] clock ticks over [`QUIET_WINDOW`].
//! That moment is the figure: when the work ended, not when the window did.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use keysync_tests::salt_ops::{stamps, FileStamp};

use crate::cluster::{seed_decided, BenchCluster};
use crate::procfs::{clock_ticks, cpu_ticks};
use crate::report::{AdoptAgentRow, AdoptRow};
use crate::Settings;

/// How often the agents' CPU time is read.
const SAMPLE: Duration = Duration::from_millis(100);
/// How long the agents must stay (nearly) idle to count as quiet ...
pub const QUIET_WINDOW: Duration = Duration::from_secs(3);
/// ... using at most this many clock ticks (10 ms each) between the three of
/// them: an idle agent's timers and link keep-alives cost a tick now and then.
pub const QUIET_TICKS: u64 = 3;
/// How often `status` is asked until every link is up (it costs the agents CPU).
const STATUS_EVERY: Duration = Duration::from_millis(500);
const ADOPT_TIMEOUT: Duration = Duration::from_secs(300);

/// Per key file (`folder/name`): inode, mtime and ctime.
type Snapshot = BTreeMap<String, FileStamp>;

pub fn run(settings: &Settings, keys: &[String]) -> anyhow::Result<AdoptRow> {
    let mut cluster = BenchCluster::new(settings, "adopt")?;
    let n = settings.n_adopt;
    let seeding = Instant::now();
    for idx in 0..3 {
        seed_decided(cluster.pki(idx), "adopt", n, keys)?;
    }
    // The seeding's writeback must not land on the agents' first syncfs.
    Command::new("sync").status().context("cannot run sync")?;
    let seed_secs = seeding.elapsed().as_secs_f64();
    let before: Vec<Snapshot> = (0..3).map(|idx| snapshot(cluster.pki(idx))).collect::<Result<_, _>>()?;
    if settings.adopt_cold {
        // Every clean page, inode and directory entry, after the snapshot
        // stat()ed every file: the folders and key files are on the disk only.
        std::fs::write("/proc/sys/vm/drop_caches", "3")
            .context("--adopt-cold drops the page cache: it needs root (/proc/sys/vm/drop_caches)")?;
    }

    let t0 = Instant::now();
    for idx in 0..3 {
        cluster.spawn(idx);
    }
    let pids: Vec<u32> = (0..3).map(|idx| cluster.pid(idx).context("agent not running")).collect::<Result<_, _>>()?;
    let quiet = wait_quiet(&cluster, &pids, t0)?;
    let ticks_per_sec = clock_ticks()?;

    let mut agents = Vec::new();
    let mut files_written = 0;
    let mut files_touched = 0;
    for (idx, &pid) in pids.iter().enumerate() {
        let after = snapshot(cluster.pki(idx))?;
        let (written, touched) = compare(&before[idx], &after);
        files_written += written;
        files_touched += touched;
        let memory = crate::procfs::memory(pid)?;
        let audit = std::fs::read_to_string(&cluster.files[idx].audit_log).unwrap_or_default();
        agents.push(AdoptAgentRow {
            node: cluster.files[idx].name.clone(),
            started_secs: quiet.started[idx].as_secs_f64(),
            cpu_secs: quiet.ticks[idx] as f64 / ticks_per_sec,
            audit_records: audit.lines().count(),
            files_written: written,
            rss_mib: memory.rss_mib,
            peak_rss_mib: memory.peak_rss_mib,
            peak_sampled_at_secs: quiet.peak_sampled_at[idx].as_secs_f64(),
            link_timeouts: cluster.link_timeouts(idx),
        });
    }
    cluster.stop()?;
    Ok(AdoptRow {
        n_keys: n,
        seed_secs,
        cold: settings.adopt_cold,
        quiet_secs: quiet.at.as_secs_f64(),
        links_up_secs: quiet.links_up.as_secs_f64(),
        quiet_window_secs: QUIET_WINDOW.as_secs_f64(),
        quiet_ticks: QUIET_TICKS,
        files_checked: before.iter().map(BTreeMap::len).sum(),
        files_written,
        files_touched,
        agents,
    })
}

/// When the agents fell quiet, measured from `t0` (their spawn).
struct Quiet {
    at: Duration,
    /// When each agent logged its start (its first start's reading done).
    started: Vec<Duration>,
    /// When every link of every agent was first seen up.
    links_up: Duration,
    /// Each agent's CPU ticks from its spawn until `at`.
    ticks: Vec<u64>,
    /// When each agent's resident set was the highest of those sampled.
    peak_sampled_at: Vec<Duration>,
}

/// Samples the agents' CPU time until they are quiet (see the module doc).
fn wait_quiet(cluster: &BenchCluster, pids: &[u32], t0: Instant) -> anyhow::Result<Quiet> {
    let window = (QUIET_WINDOW.as_millis() / SAMPLE.as_millis()) as usize;
    // Per sample: when, and each agent's ticks.
    let mut samples: Vec<(Duration, Vec<u64>)> = Vec::new();
    let mut started: Vec<Option<Duration>> = vec![None; pids.len()];
    let mut links_up: Option<(Duration, usize)> = None;
    let mut peak: Vec<(f64, Duration)> = vec![(0.0, Duration::ZERO); pids.len()];
    let mut asked = t0;
    let mut next = t0;
    loop {
        next += SAMPLE;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let ticks: Vec<u64> = pids.iter().map(|&pid| cpu_ticks(pid)).collect::<Result<_, _>>()?;
        let now = t0.elapsed();
        samples.push((now, ticks));
        // VmHWM says how high, not when: the sampled resident set says roughly when.
        for (idx, &pid) in pids.iter().enumerate() {
            let rss = crate::procfs::memory(pid)?.rss_mib;
            if rss > peak[idx].0 {
                peak[idx] = (rss, now);
            }
        }
        for (idx, at) in started.iter_mut().enumerate() {
            if at.is_none() && cluster.has_started(idx)? {
                *at = Some(now);
            }
        }
        if now > ADOPT_TIMEOUT {
            bail!("the agents were not quiet within {ADOPT_TIMEOUT:?} (started: {started:?}, links up: {links_up:?})");
        }
        if started.iter().any(Option::is_none) {
            continue;
        }
        if links_up.is_none() && asked.elapsed() >= STATUS_EVERY {
            asked = Instant::now();
            if all_links_up(cluster)? {
                links_up = Some((now, samples.len() - 1));
            }
        }
        let Some((_, first)) = links_up else { continue };
        // The window starts once every link is up, and must be idle.
        let last = samples.len() - 1;
        if last < first + window {
            continue;
        }
        let total = |s: usize| samples[s].1.iter().sum::<u64>();
        let from = last - window;
        if total(last) - total(from) > QUIET_TICKS {
            continue;
        }
        // Back to the last busy sample before the window, but not before the
        // links were up: the work ended there.
        let mut at = from;
        while at > first && total(at) == total(at - 1) {
            at -= 1;
        }
        return Ok(Quiet {
            at: samples[at].0,
            started: started.into_iter().map(Option::unwrap_or_default).collect(),
            links_up: links_up.map(|(t, _)| t).unwrap_or_default(),
            ticks: samples[at].1.clone(),
            peak_sampled_at: peak.into_iter().map(|(_, at)| at).collect(),
        });
    }
}

/// Every agent's links to both peers are up (after their first
/// anti-entropy round), and the rounds found nothing differing.
fn all_links_up(cluster: &BenchCluster) -> anyhow::Result<bool> {
    for f in &cluster.files {
        let socket = f.dir.join("state/control.sock");
        let report = salt_keysync::cli::status::query(&socket)
            .with_context(|| format!("cannot ask {} for its status", f.name))?;
        for peer in &report.peers {
            if peer.state != salt_keysync::ops::board::LinkState::Up {
                return Ok(false);
            }
            match &peer.anti_entropy {
                None => return Ok(false),
                Some(run) if run.differing_buckets > 0 => {
                    bail!("{} and {} found differing digests on identical folders: {run:?}", f.name, peer.name)
                }
                Some(_) => {}
            }
        }
    }
    Ok(true)
}

/// Inode, mtime and ctime of every file in the three key folders.
fn snapshot(pki: &Path) -> anyhow::Result<Snapshot> {
    Ok(stamps(pki)?)
}

/// (written, touched): files new, gone, or with another inode or mtime;
/// and files whose only change is their ctime (mode, owner or links).
fn compare(before: &Snapshot, after: &Snapshot) -> (usize, usize) {
    let mut written = after.keys().filter(|name| !before.contains_key(*name)).count();
    let mut touched = 0;
    for (name, old) in before {
        match after.get(name) {
            Some(new) if new.written != old.written => written += 1,
            Some(new) if new.changed != old.changed => touched += 1,
            Some(_) => {}
            None => written += 1,
        }
    }
    (written, touched)
}
