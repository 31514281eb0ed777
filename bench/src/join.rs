//! Join: master A holds `n_join` decided keys (files written before its
//! agent's first start, as on a master that already has its keys), B joins
//! empty and takes them, then C joins empty with two peers holding them —
//! timed next to `rsync -a` of the same three folders. Then the agents'
//! memory with that many keys, and their CPU time while idle.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use keysync_tests::salt_ops::{path, FOLDERS};

use crate::cluster::{seed_decided, BenchCluster, REJECTED_EVERY};
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
    seed_decided(&a, SEED_PREFIX, n, keys)?;
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
/// the inotify event of the last key to arrive.
pub(crate) fn join_one(cluster: &mut BenchCluster, idx: usize, want: (usize, usize)) -> anyhow::Result<f64> {
    let mut arrivals = JoinWatch::new(cluster.pki(idx), SEED_PREFIX, want)?;
    let t0 = Instant::now();
    cluster.start(idx)?;
    loop {
        if let Some(done) = arrivals.poll(Duration::from_millis(200))? {
            return Ok(done.saturating_duration_since(t0).as_secs_f64());
        }
        if t0.elapsed() > JOIN_TIMEOUT {
            bail!("{} holds {:?} keys after {JOIN_TIMEOUT:?}, not {want:?}", cluster.files[idx].name, arrivals.held());
        }
    }
}

/// The names [`seed_decided`] gives the keys a joining master takes.
pub(crate) const SEED_PREFIX: &str = "join";

/// The keys named `prefix…` arriving in a joining master's `minions/` and
/// `minions_rejected/`. Arrivals are counted from events; the folders are
/// listed only to confirm the count (re-listing a folder of 100,000 entries
/// every few milliseconds would take one of the machine's two cores from the
/// agents being measured).
pub(crate) struct JoinWatch {
    pki: PathBuf,
    prefix: &'static str,
    want: (usize, usize),
    /// (when, Some(true): a name arrived; Some(false): events were lost).
    rx: std::sync::mpsc::Receiver<(Instant, bool)>,
    _watcher: notify::RecommendedWatcher,
    last_event: Option<Instant>,
    /// Events were lost: the listing that finds every key dates the join.
    lost: bool,
    events: usize,
    /// `events` when the folders were last listed.
    listed_at: usize,
    /// The last event read or listing made: the folders are listed again
    /// after [`QUIET`] without either.
    last_activity: Instant,
}

/// No event for this long: the folders are listed.
const QUIET: Duration = Duration::from_millis(200);

impl JoinWatch {
    pub(crate) fn new(pki: &Path, prefix: &'static str, want: (usize, usize)) -> anyhow::Result<JoinWatch> {
        use notify::{EventKind, RecursiveMode, Watcher};
        let (tx, rx) = std::sync::mpsc::channel();
        let handler = move |event: notify::Result<notify::Event>| {
            let at = Instant::now();
            let arrived = match event {
                Ok(e) if e.need_rescan() => Some(false),
                Ok(e) => (matches!(e.kind, EventKind::Create(_) | EventKind::Modify(_))
                    && e.paths.iter().any(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix))))
                .then_some(true),
                Err(_) => Some(false),
            };
            if let Some(arrived) = arrived {
                let _ = tx.send((at, arrived));
            }
        };
        let mut watcher = notify::RecommendedWatcher::new(handler, crate::watch_config())?;
        for folder in ["minions", "minions_rejected"] {
            watcher.watch(&pki.join(folder), RecursiveMode::NonRecursive)?;
        }
        Ok(JoinWatch {
            pki: pki.to_path_buf(),
            prefix,
            want,
            rx,
            _watcher: watcher,
            last_event: None,
            lost: false,
            events: 0,
            listed_at: 0,
            last_activity: Instant::now(),
        })
    }

    /// The keys named `prefix…` the folders hold: (accepted, rejected).
    pub(crate) fn held(&self) -> (usize, usize) {
        (
            crate::cluster::count_named(&self.pki, "minions", self.prefix),
            crate::cluster::count_named(&self.pki, "minions_rejected", self.prefix),
        )
    }

    /// Reads the events that come within `wait` (none: returns at once) and
    /// returns when the join was done once the folders hold `want`: the last
    /// key's event, or the listing that found them when events were lost.
    pub(crate) fn poll(&mut self, wait: Duration) -> anyhow::Result<Option<Instant>> {
        let first = match self.rx.recv_timeout(wait) {
            Ok(first) => Some(first),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
            Err(e) => bail!("watching {}: {e}", self.pki.display()),
        };
        for (at, arrived) in first.into_iter().chain(self.rx.try_iter()) {
            self.last_activity = at;
            if arrived {
                self.last_event = Some(at);
                self.events += 1;
            } else {
                self.lost = true;
            }
        }
        // Listed when the events say every key may be there, or when quiet.
        let quiet = self.last_activity.elapsed() >= QUIET;
        let total = self.want.0 + self.want.1;
        if quiet || self.events >= total && self.events != self.listed_at {
            self.listed_at = self.events.max(1);
            let listed = Instant::now();
            self.last_activity = listed;
            if self.held() == self.want {
                return Ok(Some(match self.last_event {
                    Some(at) if !self.lost => at,
                    _ => listed,
                }));
            }
        }
        Ok(None)
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
            link_timeouts: cluster.link_timeouts(idx),
        });
    }
    Ok(rows)
}
