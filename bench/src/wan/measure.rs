//! The two measurements of one configuration, on agents in namespaces
//! linked by the delay line: accepts made as Salt 3008 makes them, each on
//! the next master in turn and dated on its peers by inotify; and an empty
//! master joining peers that hold K keys.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use keysync_tests::salt_ops::{move_key, SaltLine};

use crate::cluster::{seed_decided, REJECTED_EVERY};
use crate::latency::write_pending;
use crate::procfs::memory;
use crate::report::OpRow;
use crate::wan::delay::DelayLine;
use crate::wan::mesh::Mesh;
use crate::wan::netns::Namespaces;
use crate::wan::report::{JoinFigures, LiveFigures};
use crate::wan::{Config, WanSettings};
use crate::watch::{Final, PeerWatch};

/// How long an accept may take to reach every peer before it counts as missed.
const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for the agents' links to come up after their start.
const LINKS_UP: Duration = Duration::from_secs(180);
/// Longest wait for the links to have probed their paths once up.
const PATHS_PROBED: Duration = Duration::from_secs(30);

/// Accepts on master `d % n` for `settings.decisions` decisions, one at a
/// time, `settings.pace` apart at least, the masters holding
/// `settings.seed` agreed keys (work for the anti-entropy rounds).
pub fn live(
    settings: &WanSettings,
    config: &Config,
    ns: &Namespaces,
    line: &DelayLine,
    keys: &[String],
) -> anyhow::Result<LiveFigures> {
    let n = config.masters;
    let mut mesh = Mesh::new(settings, ns, n, &format!("live-{}", config.label()))?;
    for i in 0..n {
        seed_decided(mesh.pki(i), "seed", settings.seed, keys)?;
    }
    Command::new("sync").status().context("cannot run sync")?;
    mesh.cluster.start_all()?;
    let all: Vec<usize> = (0..n).collect();
    mesh.wait_links_up(&all, LINKS_UP)?;
    let up = line.counts();
    mesh.wait_paths_probed(&all, PATHS_PROBED)?;
    let probing = line.counts().since(&up);

    let ids: Vec<String> = (0..settings.decisions).map(|d| format!("wan{d:06}")).collect();
    // As on a multi-master site: every minion sent its key to every master.
    let pkis: Vec<PathBuf> = (0..n).map(|i| mesh.pki(i).to_path_buf()).collect();
    write_pending(&mesh.cluster, &pkis, &ids, keys)?;
    // Per origin, its peers' folders.
    let watches: Vec<PeerWatch> = (0..n)
        .map(|o| {
            let peers: Vec<&std::path::Path> = (0..n).filter(|&p| p != o).map(|p| mesh.pki(p)).collect();
            PeerWatch::new(&peers)
        })
        .collect::<Result<_, _>>()?;

    let received = |how: &str| mesh.sum("keysync_decisions_received_total", &format!("how=\"{how}\""));
    let copied = || mesh.sum("keysync_decisions_copied_total", "");
    let (pushes0, fetches0, copies0) = (received("push")?, received("fetch")?, copied()?);
    let rounds0 = mesh.sum("keysync_anti_entropy_runs_total", "")?;
    let counts0 = line.counts();
    let started = Instant::now();
    let mut samples = Vec::new();
    for (d, id) in ids.iter().enumerate() {
        let begun = Instant::now();
        let origin = d % n;
        watches.iter().for_each(PeerWatch::drain);
        move_key(SaltLine::S3008, mesh.pki(origin), id, "minions");
        let t0 = Instant::now();
        let want = Final::In("minions", keys[d % keys.len()].as_bytes().to_vec());
        samples.extend(watches[origin].wait_final(id, &want, t0, OP_TIMEOUT));
        std::thread::sleep(settings.pace.saturating_sub(begun.elapsed()));
    }
    let measured_secs = started.elapsed().as_secs_f64();
    // Pushes forwarded after every peer had the decision are still on the way.
    std::thread::sleep(config.rtt * 2 + Duration::from_millis(500));
    let counts = line.counts().since(&counts0);
    let per_decision = |x: f64| x / settings.decisions.max(1) as f64;
    let figures = LiveFigures {
        latency: OpRow::new("accept", "3008", samples),
        // The peers receive the copies by push too.
        pushes_per_decision: per_decision(received("push")? - pushes0 - (copied()? - copies0)),
        copies_per_decision: per_decision(copied()? - copies0),
        fetches_per_decision: per_decision(received("fetch")? - fetches0),
        bytes_per_decision: per_decision(counts.total_bytes() as f64),
        probing_bytes_per_link: probing.total_bytes() as f64 / (n * (n - 1) / 2).max(1) as f64,
        rounds: mesh.sum("keysync_anti_entropy_runs_total", "")? - rounds0,
        packets_lost: counts.total_lost(),
        links_silent: silent_links(&counts, n),
        measured_secs,
        peak_rss_mib: peak(&mesh, 0..n)?,
    };
    mesh.cluster.stop()?;
    Ok(figures)
}

/// An empty master (the last) joins the others, which hold `n_keys` agreed
/// keys (one in [`REJECTED_EVERY`] rejected).
pub fn join(
    settings: &WanSettings,
    config: &Config,
    ns: &Namespaces,
    line: &DelayLine,
    keys: &[String],
    n_keys: usize,
) -> anyhow::Result<JoinFigures> {
    let n = config.masters;
    let joiner = n - 1;
    let mut mesh = Mesh::new(settings, ns, n, &format!("join{n_keys}-{}", config.label()))?;
    for i in 0..joiner {
        seed_decided(mesh.pki(i), "join", n_keys, keys)?;
    }
    Command::new("sync").status().context("cannot run sync")?;
    for i in 0..joiner {
        mesh.cluster.start(i)?;
    }
    mesh.wait_links_up(&(0..joiner).collect::<Vec<_>>(), LINKS_UP)?;

    let watch = PeerWatch::new(&[mesh.pki(joiner)])?;
    let counts0 = line.counts();
    line.forget_first();
    let t0 = Instant::now();
    mesh.cluster.spawn(joiner);
    let timeout = Duration::from_secs(600);
    let Some(first_key) = watch.wait_first_event(timeout) else {
        bail!("the joiner received no key within {timeout:?}; see {}", mesh.cluster.log(joiner).display());
    };
    let ids: Vec<String> = (0..n_keys).map(|i| format!("join{i:07}")).collect();
    let want = |id: &str| {
        let i: usize = id["join".len()..].parse().unwrap_or(0);
        let folder = if i.is_multiple_of(REJECTED_EVERY) { "minions_rejected" } else { "minions" };
        Final::In(folder, keys[i % keys.len()].as_bytes().to_vec())
    };
    let Some(all) = watch.wait_all(&ids, want, t0, timeout)[0] else {
        bail!("the joiner did not hold all {n_keys} keys within {timeout:?}");
    };
    let counts = line.counts().since(&counts0);
    let first_packet = counts.first_from[joiner].context("the delay line saw no packet of the joiner")?;
    let to_first_key = first_key.saturating_duration_since(first_packet);
    let key_bytes: usize = (0..n_keys).map(|i| keys[i % keys.len()].len()).sum();
    let figures = JoinFigures {
        keys: n_keys,
        first_key_ms: to_first_key.as_secs_f64() * 1e3,
        first_key_rtts: to_first_key.as_secs_f64() / config.rtt.as_secs_f64().max(1e-3),
        all_keys_secs: all.as_secs_f64(),
        bytes_received_ratio: counts.bytes_to(joiner) as f64 / key_bytes.max(1) as f64,
        key_bytes,
        joiner_peak_rss_mib: peak(&mesh, joiner..n)?,
    };
    mesh.cluster.stop()?;
    Ok(figures)
}

/// Links (src, dst) that carried no packet: each must carry some.
fn silent_links(counts: &crate::wan::delay::Counts, n: usize) -> usize {
    (0..n).flat_map(|s| (0..n).map(move |d| (s, d))).filter(|&(s, d)| s != d && counts.link_packets(s, d) == 0).count()
}

/// The largest peak resident memory of the agents `range`, in MiB.
fn peak(mesh: &Mesh, range: std::ops::Range<usize>) -> anyhow::Result<f64> {
    let mut peak: f64 = 0.0;
    for i in range {
        let pid = mesh.cluster.pid(i).context("agent not running")?;
        peak = peak.max(memory(pid)?.peak_rss_mib);
    }
    Ok(peak)
}
