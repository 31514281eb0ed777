//! `salt-keysync demo`: three real agents in this process, on 127.0.0.1,
//! in a temporary folder with certificates made on the spot. It plays
//! `salt-key -a`, `-r` and `-d` on master-a exactly as Salt 3008 does them on
//! disk, times each decision until it is on master-b and master-c, shows the
//! audit records, and removes everything again (also on Ctrl-C).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::disk::audit::{read_verified, Record};
use anyhow::{bail, Context, Result};
use keysync_server::CertAuthority;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const EXAMPLES: &str = "\
Examples:
  salt-keysync demo              # run it, print the latencies, clean up
  salt-keysync demo --keep       # leave the folder (certs, configs, key folders, audit logs)
  salt-keysync demo --hold       # keep the cluster running to try moves by hand; Ctrl-C ends it

Exits 0 only if every decision reached both other masters.";

#[derive(clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct DemoArgs {
    /// Leave the demo folder for inspection instead of removing it.
    #[arg(long)]
    keep: bool,
    /// After the three operations keep the agents running until Ctrl-C.
    #[arg(long)]
    hold: bool,
}

const NAMES: [&str; 3] = ["master-a", "master-b", "master-c"];
const FOLDERS: [&str; 3] = ["minions", "minions_pre", "minions_rejected"];
/// Longest wait for one propagation, or for the links to come up.
const PROPAGATION_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

pub fn demo(args: &DemoArgs) -> Result<()> {
    // Everything the demo and its agents create is private: files 0600, folders 0700.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let root =
        tempfile::Builder::new().prefix("salt-keysync-demo.").tempdir().context("cannot make a temporary folder")?;
    crate::say!("demo folder: {}", root.path().display());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(run_demo(root.path(), args.hold));
    drop(runtime);
    if args.keep {
        let kept = root.keep();
        crate::say!("kept {} (remove it with: rm -r {})", kept.display(), kept.display());
    } else {
        let path = root.path().to_path_buf();
        root.close().with_context(|| format!("cannot remove {}", path.display()))?;
        crate::say!("removed {}", path.display());
    }
    outcome
}

async fn run_demo(root: &Path, hold: bool) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    // Installed first, so that Ctrl-C during the demo stops the agents and cleans up.
    let (mut int, mut term) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
    let mut interrupted = pin!(async move {
        tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        }
    });
    let cluster = Cluster::start(root).await?;
    let outcome = tokio::select! {
        outcome = scenario(&cluster) => outcome,
        signal = &mut interrupted => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    if outcome.is_ok() && hold {
        crate::say!("\nThe three agents keep running. In another shell, act like salt-key on any master, e.g.");
        let b = &cluster.nodes[1].pki;
        crate::say!("  mv {}/minions_rejected/db01 {}/minions/db01", b.display(), b.display());
        crate::say!("  ls {}/master-*/pki/minions", root.display());
        crate::say!("Press Ctrl-C to stop the agents and remove the folder.");
        let signal = interrupted.await;
        crate::say!("{signal}: stopping");
    }
    cluster.stop().await;
    outcome
}

/// One agent of the demo.
struct Node {
    name: &'static str,
    pki: PathBuf,
    cache: PathBuf,
    audit_log: PathBuf,
}

struct Cluster {
    nodes: Vec<Node>,
    shutdown: CancellationToken,
    agents: Vec<JoinHandle<Result<()>>>,
}

impl Cluster {
    async fn start(root: &Path) -> Result<Cluster> {
        let ca = CertAuthority::new("salt-keysync demo CA")?;
        let mut listeners = Vec::new();
        for _ in NAMES {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.context("cannot listen on 127.0.0.1")?);
        }
        let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr()).collect::<Result<_, _>>()?;
        let shutdown = CancellationToken::new();
        let (mut nodes, mut agents) = (Vec::new(), Vec::new());
        for (idx, listener) in listeners.into_iter().enumerate() {
            let name = NAMES[idx];
            let peers: Vec<_> = (0..NAMES.len()).filter(|&j| j != idx).map(|j| (NAMES[j], addrs[j])).collect();
            let config_path = write_node(root, &ca, name, addrs[idx], &peers)?;
            let config = Config::load(&config_path)?;
            crate::say!("  {name}  listening on {}", addrs[idx]);
            nodes.push(Node {
                name,
                pki: config.pki_dir.clone(),
                cache: config.salt.cachedir.clone(),
                audit_log: config.audit_log.clone(),
            });
            agents.push(tokio::spawn(crate::agent::run(config, Some(listener), shutdown.clone())));
        }
        let cluster = Cluster { nodes, shutdown, agents };
        let started = Instant::now();
        cluster.links_up().await?;
        crate::say!("  6 mTLS links up in {}", ms(started.elapsed()));
        // Each link runs one anti-entropy round right after connecting; let it finish so the
        // first measurement is of a live push, not of that round.
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(cluster)
    }

    /// Waits until every agent has admitted both others (audited `connect`).
    async fn links_up(&self) -> Result<()> {
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            if let Some(failed) = self.agents.iter().position(JoinHandle::is_finished) {
                bail!("agent {} stopped during start-up", NAMES[failed]);
            }
            let up = self.nodes.iter().all(|node| {
                let records = read_verified(&node.audit_log).unwrap_or_default();
                NAMES
                    .iter()
                    .filter(|&&peer| peer != node.name)
                    .all(|peer| records.iter().any(|r| r.action == "connect" && r.peer.as_deref() == Some(*peer)))
            });
            if up {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the agents did not connect to each other within {CONNECT_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        for (name, agent) in NAMES.iter().zip(self.agents) {
            match tokio::time::timeout(Duration::from_secs(10), agent).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => eprintln!("agent {name} failed: {}", crate::text::error_chain(e.as_ref())),
                Ok(Err(e)) => eprintln!("agent {name} panicked: {e}"),
                Err(_) => eprintln!("agent {name} did not stop within 10 s"),
            }
        }
    }
}

/// Writes one agent's certificates, folders and config under `root/name`;
/// returns the config's path.
fn write_node(
    root: &Path,
    ca: &CertAuthority,
    name: &str,
    listen: std::net::SocketAddr,
    peers: &[(&str, std::net::SocketAddr)],
) -> Result<PathBuf> {
    let dir = root.join(name);
    for sub in ["pki/minions", "pki/minions_pre", "pki/minions_rejected", "cache", "state", "tls"] {
        let path = dir.join(sub);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
    }
    let now = time::OffsetDateTime::now_utc();
    let issued = ca.issue(&[name], now - time::Duration::hours(1), now + time::Duration::days(1))?;
    write_private(&dir.join("tls/ca.pem"), &ca.cert_pem())?;
    write_private(&dir.join("tls/node.pem"), &issued.cert_pem)?;
    write_private(&dir.join("tls/node.key"), &issued.key_pem)?;
    let mut config = format!(
        "# A demo agent; see README.md for a real configuration.\n\
         node = \"{name}\"\npki_dir = \"pki\"\nstate_dir = \"state\"\nlisten = \"{listen}\"\n\n\
         [tls]\nca = \"tls/ca.pem\"\ncert = \"tls/node.pem\"\nkey = \"tls/node.key\"\n\n\
         [salt]\ncachedir = \"cache\"\nmaster_id = \"{name}_master\"\nmaster_config = \"salt-master.conf\"\n\n\
         [timings]\nreconnect_max = \"500ms\"\n"
    );
    for (peer, address) in peers {
        config.push_str(&format!("\n[[peer]]\nname = \"{peer}\"\naddress = \"{address}\"\n"));
    }
    let config_path = dir.join("config.toml");
    write_private(&config_path, &config)?;
    // The master config it names (a named one that does not exist is refused).
    write_private(&dir.join("salt-master.conf"), "# a demo master: every setting is Salt's default\n")?;
    Ok(config_path)
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

/// The decisions, timed, then the audit trail.
async fn scenario(cluster: &Cluster) -> Result<()> {
    let [a, b, c] = [&cluster.nodes[0], &cluster.nodes[1], &cluster.nodes[2]];
    let web01 = rcgen::KeyPair::generate()?.public_key_pem();
    let db01 = rcgen::KeyPair::generate()?.public_key_pem();
    // Each minion sends its key to every master: pending everywhere.
    for node in &cluster.nodes {
        write_in_place(&node.pki.join("minions_pre/web01"), &web01)?;
        write_in_place(&node.pki.join("minions_pre/db01"), &db01)?;
    }
    // As an operator would, act once `salt-key -L` lists them: once every agent has seen them.
    let deadline = Instant::now() + PROPAGATION_TIMEOUT;
    while !cluster.nodes.iter().all(|node| {
        let records = read_verified(&node.audit_log).unwrap_or_default();
        ["web01", "db01"]
            .iter()
            .all(|id| records.iter().any(|r| r.action == "pending" && r.minion.as_deref() == Some(*id)))
    }) {
        if Instant::now() > deadline {
            bail!("the agents did not see the pending keys within {PROPAGATION_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    crate::say!("\nweb01 and db01 ask to join: their keys are pending on all three masters");
    crate::say!("salt-key on master-a (Salt 3008's file pattern), until the file is in place on the others:\n");

    let mut failures = 0;
    let peers = [b, c];
    // salt-key -a web01
    let key = web01.clone();
    let accepted =
        move |pki: &Path| is_exactly(&pki.join("minions/web01"), &key) && !pki.join("minions_pre/web01").exists();
    let started = salt3008_move(&a.pki, "web01", &web01, "minions")?;
    failures += report("accept", "web01", started, &peers, accepted).await;

    // salt-key -r db01 (a pending key: no minion was trusted with it, so no AES rotation).
    let key = db01.clone();
    let rejected = move |pki: &Path| {
        is_exactly(&pki.join("minions_rejected/db01"), &key) && !pki.join("minions_pre/db01").exists()
    };
    let started = salt3008_move(&a.pki, "db01", &db01, "minions_rejected")?;
    failures += report("reject", "db01", started, &peers, rejected).await;

    // salt-key -d web01: web01 was trusted, so the peers also drop .dfn.
    let deleted = |pki: &Path| FOLDERS.iter().all(|folder| !pki.join(folder).join("web01").exists());
    let started = Instant::now();
    for folder in FOLDERS {
        remove_if_present(&a.pki.join(folder).join("web01"))?;
    }
    failures += report("delete", "web01", started, &peers, deleted).await;
    failures += dfn_dropped(&peers).await;
    crate::say!("\nEach figure includes the syncfs both agents make before a decision counts as done, so it");
    crate::say!("grows with the disk's load. A delete also waits `absent_grace` (40 ms): Salt 3008 removes");
    crate::say!("a key from every folder before writing it back, so a shorter absence is not a delete. And");
    crate::say!("the other masters apply a delete of an accepted key once master-a has deleted nothing else");
    crate::say!("for a second (the blast-radius guard: a mass delete is held whole, not copied everywhere).");

    show_audit(&cluster.nodes);
    if failures > 0 {
        bail!("{failures} propagation(s) did not happen");
    }
    crate::say!("\nall three decisions reached both other masters");
    Ok(())
}

/// Salt 3008's `salt-key -a/-r`: remove the id from every folder, write a
/// `tmpXXXXXXXX` (0600) into the target folder, rename it over the id.
/// Returns the instant just before the rename, when the decision is made.
fn salt3008_move(pki: &Path, id: &str, key: &str, to: &str) -> Result<Instant> {
    for folder in FOLDERS {
        remove_if_present(&pki.join(folder).join(id))?;
    }
    let tmp = pki.join(to).join(format!("tmp{:08x}", rand_u32()));
    let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    file.write_all(key.as_bytes())?;
    drop(file);
    let started = Instant::now();
    fs::rename(&tmp, pki.join(to).join(id))?;
    Ok(started)
}

/// The master receiving a key: written in place, as its auth does.
fn write_in_place(path: &Path, key: &str) -> Result<()> {
    let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(key.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

fn remove_if_present(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", path.display()))
        }
        _ => Ok(()),
    }
}

fn is_exactly(path: &Path, key: &str) -> bool {
    fs::read(path).is_ok_and(|bytes| bytes == key.as_bytes())
}

fn rand_u32() -> u32 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    nanos.subsec_nanos() ^ std::process::id().rotate_left(16)
}

/// Polls every 100 µs until `done` holds for each peer's pki_dir; prints one
/// line with each peer's latency. Returns how many peers it did not reach.
async fn report<F>(action: &str, id: &str, started: Instant, peers: &[&Node; 2], done: F) -> usize
where
    F: Fn(&Path) -> bool + Send + 'static,
{
    let pkis = [peers[0].pki.clone(), peers[1].pki.clone()];
    // On a blocking thread: tokio's timers tick in milliseconds, too coarse to measure this.
    let polled = tokio::task::spawn_blocking(move || {
        let mut reached: [Option<Duration>; 2] = [None, None];
        while reached.iter().any(Option::is_none) && started.elapsed() < PROPAGATION_TIMEOUT {
            for (slot, pki) in reached.iter_mut().zip(&pkis) {
                if slot.is_none() && done(pki) {
                    *slot = Some(started.elapsed());
                }
            }
            // Short enough for a fine measurement, long enough to leave the agents a core.
            std::thread::sleep(Duration::from_micros(100));
        }
        reached
    });
    let reached = polled.await.unwrap_or([None, None]);
    let mut line = format!("{action:<7} {id:<6}");
    for (slot, node) in reached.iter().zip(peers) {
        let to = node.name.trim_start_matches("master-").to_uppercase();
        match slot {
            Some(latency) => line.push_str(&format!("  A→{to} {:>8}", ms(*latency))),
            None => line.push_str(&format!("  A→{to} NOT within {PROPAGATION_TIMEOUT:?}")),
        }
    }
    crate::say!("{line}");
    reached.iter().filter(|slot| slot.is_none()).count()
}

/// A revocation makes each peer drop `<cachedir>/.dfn`; the demo then plays
/// the master, which consumes it when it rotates the AES key.
async fn dfn_dropped(peers: &[&Node; 2]) -> usize {
    let deadline = Instant::now() + PROPAGATION_TIMEOUT;
    let mut missing = peers.to_vec();
    while !missing.is_empty() && Instant::now() < deadline {
        missing.retain(|node| !node.cache.join(".dfn").exists());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for node in peers {
        let _ = fs::remove_file(node.cache.join(".dfn"));
    }
    if missing.is_empty() {
        crate::say!("                .dfn dropped on master-b and master-c: their masters rotate the AES key");
    } else {
        let names: Vec<_> = missing.iter().map(|n| n.name).collect();
        crate::say!("                .dfn NOT dropped on {}", names.join(", "));
    }
    missing.len()
}

/// Prints every node's records about the demo's minions, after verifying each hash chain.
fn show_audit(nodes: &[Node]) {
    crate::say!("\naudit records (hash chains verified):");
    for node in nodes {
        // A line being appended right now fails the read; the next try gets it whole.
        let records = (0..50).find_map(|_| {
            read_verified(&node.audit_log).ok().or_else(|| {
                std::thread::sleep(Duration::from_millis(10));
                None
            })
        });
        let Some(records) = records else {
            crate::say!("  {}: cannot read or verify {}", node.name, node.audit_log.display());
            continue;
        };
        for record in records.iter().filter(|r| matches!(r.minion.as_deref(), Some("web01" | "db01"))) {
            crate::say!("  {}", audit_line(record));
        }
    }
}

fn audit_line(r: &Record) -> String {
    let fingerprint =
        r.fingerprint.as_deref().map(|f| format!("  sha256 {}…", &f[..f.len().min(11)])).unwrap_or_default();
    let origin = r.origin.as_deref().map(|o| format!("origin {o}")).unwrap_or_default();
    let line = format!(
        "{:<9} {:<8} {:<6} {:<11} {:<16} via {:<9}{}",
        r.node,
        r.action,
        r.minion.as_deref().unwrap_or("-"),
        r.outcome,
        origin,
        r.via,
        fingerprint
    );
    line.trim_end().to_string()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}
