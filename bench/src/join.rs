//! Join: master A holds `n_join` decided keys (files written before its
//! agent's first start, as on a master that already has its keys), B joins
//! empty and takes them, then C joins empty with two peers holding them —
//! timed next to `rsync -a` of the same three folders. Then the agents'
//! memory with that many keys, and their CPU time while idle.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use keysync_tests::salt_ops::{path, FOLDERS};

use crate::cluster::{count_keys, seed_decided, BenchCluster, REJECTED_EVERY};
use crate::procfs::{clock_ticks, cpu_ticks};
use crate::report::{AgentRow, JoinRow};
use crate::Settings;

const JOIN_TIMEOUT: Duration = Duration::from_secs(300);

pub struct Joined {
    pub join: JoinRow,
    pub agents: Vec<AgentRow>,
}

pub fn run(settings: &Settings, keys: &[String]) -> anyhow::Result<Joined> {
    let mut cluster = BenchCluster::new(settings, "join")?;
    let n = settings.n_join;
    let a = cluster.pki(0).to_path_buf();
    let seeding = Instant::now();
    seed_decided(&a, "join", n, keys)?;
    let seed_secs = seeding.elapsed().as_secs_f64();
    let n_rejected = n.div_ceil(REJECTED_EVERY);
    let want = (n - n_rejected, n_rejected);

    let first_start = Instant::now();
    cluster.start(0)?;
    let first_start_secs = first_start.elapsed().as_secs_f64();

    let b_secs = join_one(&mut cluster, 1, want)?;
    let rsync = rsync_secs(&a, &cluster.files[0].dir.join("rsync-copy"))?;
    let c_secs = join_one(&mut cluster, 2, want)?;
    for peer in 1..3 {
        same_state(&a, cluster.pki(peer)).with_context(|| format!("{} differs from A", cluster.files[peer].name))?;
    }

    // Settles the links (the peers' outbound links to C were in backoff) before idling.
    std::thread::sleep(Duration::from_secs(2));
    let agents = idle(&cluster, settings.idle)?;
    cluster.stop()?;
    Ok(Joined {
        join: JoinRow {
            n_keys: n,
            seed_secs,
            first_start_secs,
            join_one_peer_secs: b_secs,
            join_two_peers_secs: c_secs,
            rsync_secs: rsync,
            ratio: c_secs / rsync,
        },
        agents,
    })
}

/// Starts agent `idx` on empty folders and returns the seconds from its
/// start until its folders hold `want` (accepted, rejected) keys, dated by
/// the inotify event of the last key to arrive. Arrivals are counted from
/// events; the folders are listed only to confirm the count (re-listing a
/// folder of 100,000 entries every few milliseconds would take one of the
/// machine's two cores from the agents being measured).
fn join_one(cluster: &mut BenchCluster, idx: usize, want: (usize, usize)) -> anyhow::Result<f64> {
    use notify::{EventKind, RecursiveMode, Watcher};
    let pki = cluster.pki(idx).to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    let handler = move |event: notify::Result<notify::Event>| {
        let at = Instant::now();
        // Some(true): a name arrived; Some(false): events were lost; None:
        // anything else.
        let seen = match event {
            Ok(e) if e.need_rescan() => Some(false),
            Ok(e) => matches!(e.kind, EventKind::Create(_) | EventKind::Modify(_)).then_some(true),
            Err(_) => Some(false),
        };
        if let Some(arrived) = seen {
            let _ = tx.send((at, arrived));
        }
    };
    let mut watcher = notify::RecommendedWatcher::new(handler, crate::watch_config())?;
    for folder in ["minions", "minions_rejected"] {
        watcher.watch(&pki.join(folder), RecursiveMode::NonRecursive)?;
    }
    let held = || (count_keys(&pki, "minions"), count_keys(&pki, "minions_rejected"));
    let t0 = Instant::now();
    cluster.start(idx)?;
    let mut last_event = t0;
    // Events were lost: the listing that finds every key dates the join.
    let mut lost = false;
    let mut events = 0usize;
    let mut listed_at = 0usize;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(first) => {
                for (at, arrived) in std::iter::once(first).chain(rx.try_iter()) {
                    if arrived {
                        last_event = at;
                        events += 1;
                    } else {
                        lost = true;
                    }
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => listed_at = 0,
            Err(e) => bail!("watching {}: {e}", pki.display()),
        }
        // Listed when the events say every key may be there, or when quiet.
        if listed_at == 0 || events >= want.0 + want.1 && events != listed_at {
            listed_at = events.max(1);
            let listed = Instant::now();
            if held() == want {
                let done = if lost { listed } else { last_event };
                return Ok(done.saturating_duration_since(t0).as_secs_f64());
            }
        }
        if t0.elapsed() > JOIN_TIMEOUT {
            let have = held();
            bail!("{} holds {have:?} keys after {JOIN_TIMEOUT:?}, not {want:?}", cluster.files[idx].name);
        }
    }
}

/// `rsync -a` of A's three key folders into an empty folder, in seconds.
fn rsync_secs(pki: &Path, dest: &Path) -> anyhow::Result<f64> {
    std::fs::create_dir_all(dest)?;
    let t0 = Instant::now();
    let status = Command::new("rsync")
        .arg("-a")
        .args(FOLDERS.iter().map(|f| pki.join(f)))
        .arg(dest)
        .status()
        .context("cannot run rsync: install it (apt-get install rsync) or use scripts/bench.sh")?;
    let secs = t0.elapsed().as_secs_f64();
    if !status.success() {
        bail!("rsync -a into {} failed: {status}", dest.display());
    }
    // rsync does not flush: its writeback must not land on the next joiner's
    // first syncfs (untimed here, as rsync's own writeback is).
    Command::new("sync").status().context("cannot run sync")?;
    Ok(secs)
}

/// Both pki folders hold the same names with the same bytes.
fn same_state(a: &Path, b: &Path) -> anyhow::Result<()> {
    for folder in FOLDERS {
        let names = |pki: &Path| -> anyhow::Result<std::collections::BTreeSet<String>> {
            let mut out = std::collections::BTreeSet::new();
            for entry in std::fs::read_dir(pki.join(folder))? {
                let name = entry?.file_name().to_string_lossy().into_owned();
                if !name.starts_with('.') {
                    out.insert(name);
                }
            }
            Ok(out)
        };
        let (ours, theirs) = (names(a)?, names(b)?);
        if ours != theirs {
            bail!("{folder}: {} names against {}", ours.len(), theirs.len());
        }
        for name in &ours {
            if std::fs::read(path(a, folder, name))? != std::fs::read(path(b, folder, name))? {
                bail!("{folder}/{name} differs");
            }
        }
    }
    Ok(())
}

/// Each agent's memory, and its CPU time over `idle`.
fn idle(cluster: &BenchCluster, idle: Duration) -> anyhow::Result<Vec<AgentRow>> {
    let pids: Vec<u32> = (0..3).map(|idx| cluster.pid(idx).context("agent not running")).collect::<Result<_, _>>()?;
    let before: Vec<u64> = pids.iter().map(|&pid| cpu_ticks(pid)).collect::<Result<_, _>>()?;
    std::thread::sleep(idle);
    let ticks_per_sec = clock_ticks()?;
    let mut rows = Vec::new();
    for (idx, &pid) in pids.iter().enumerate() {
        let cpu = (cpu_ticks(pid)? - before[idx]) as f64 / ticks_per_sec;
        let memory = crate::procfs::memory(pid)?;
        rows.push(AgentRow {
            node: cluster.files[idx].name.clone(),
            rss_mib: memory.rss_mib,
            peak_rss_mib: memory.peak_rss_mib,
            idle_cpu_secs: cpu,
            idle_secs: idle.as_secs_f64(),
        });
    }
    Ok(rows)
}
