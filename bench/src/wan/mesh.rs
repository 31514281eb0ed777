//! `n` real agents, each in its master's network namespace, listening on
//! the master's private address and peering with all the others (a full
//! mesh) through the delay line. Their certificates name their node names,
//! which is what a peer verifies whatever address it dialled. Production
//! timings, but for the anti-entropy interval if the benchmark shortens it;
//! each agent serves its metrics on its namespace's own loopback, which the
//! benchmark scrapes from a thread inside it (never through the delay line).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use keysync_tests::cluster::{write_agent_files, AgentFiles};

use crate::cluster::{bench_folder, make_private, use_default_timings, BenchCluster, Layout};
use crate::wan::netns::{address, Namespaces};
use crate::wan::WanSettings;

/// The port every agent listens on, each on its own address.
const PORT: u16 = 4515;
/// The metrics port, on each namespace's loopback.
const METRICS_PORT: u16 = 9515;

/// Master `i`'s node name: master-a, master-b, ...
pub fn name(i: usize) -> String {
    format!("master-{}", (b'a' + i as u8) as char)
}

pub struct Mesh<'a> {
    pub cluster: BenchCluster,
    ns: &'a Namespaces,
}

impl<'a> Mesh<'a> {
    /// Writes the files of `n` agents (one per namespace of `ns`) under a
    /// fresh folder, or `settings.keep/label`.
    pub fn new(settings: &WanSettings, ns: &'a Namespaces, n: usize, label: &str) -> anyhow::Result<Mesh<'a>> {
        let (root, path) = bench_folder(settings.keep.as_deref(), label, "keysync-bench-wan-")?;
        let ca = keysync_server::CertAuthority::new("keysync-bench WAN CA")?;
        let listen = |i: usize| SocketAddr::from((address(i), PORT));
        let mut files: Vec<AgentFiles> = Vec::new();
        for i in 0..n {
            let peers: Vec<(String, SocketAddr)> = (0..n).filter(|&j| j != i).map(|j| (name(j), listen(j))).collect();
            let f = write_agent_files(&path, &ca, &name(i), listen(i), &peers);
            use_default_timings(&f.config_path, false)?;
            tune(&f.config_path, settings.anti_entropy)?;
            make_private(&f.dir)?;
            files.push(f);
        }
        let mut cluster = BenchCluster::from_files(files, &settings.log_filter, Layout::Plain, root);
        for i in 0..n {
            cluster.wrap(i, ns.exec_wrapper(i));
        }
        Ok(Mesh { cluster, ns })
    }

    pub fn len(&self) -> usize {
        self.cluster.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cluster.files.is_empty()
    }

    pub fn pki(&self, i: usize) -> &Path {
        self.cluster.pki(i)
    }

    /// Agent `i`'s metrics: each sample's name with its labels, and value.
    pub fn metrics(&self, i: usize) -> anyhow::Result<BTreeMap<String, f64>> {
        let text = self.ns.run_in(i, || scrape(SocketAddr::from(([127, 0, 0, 1], METRICS_PORT))))??;
        Ok(text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.rsplit_once(' '))
            .filter_map(|(series, value)| Some((series.to_string(), value.parse().ok()?)))
            .collect())
    }

    /// The sum over all agents of every series of `metric` whose labels
    /// contain `label` (e.g. `how="push"`; empty: all).
    pub fn sum(&self, metric: &str, label: &str) -> anyhow::Result<f64> {
        let mut sum = 0.0;
        for i in 0..self.len() {
            sum += self
                .metrics(i)?
                .iter()
                .filter(|(series, _)| series.split('{').next() == Some(metric) && series.contains(label))
                .map(|(_, value)| value)
                .sum::<f64>();
        }
        Ok(sum)
    }

    /// Waits until each agent of `agents` has its links to the others of
    /// `agents` up (a link is up after its first anti-entropy round).
    pub fn wait_links_up(&self, agents: &[usize], timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        for &i in agents {
            loop {
                let metrics = self.metrics(i)?;
                let up = agents
                    .iter()
                    .filter(|&&j| j != i)
                    .all(|&j| metrics.get(&format!("keysync_peer_up{{peer=\"{}\"}}", name(j))) == Some(&1.0));
                if up {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "{}'s links were not all up within {timeout:?}; see {}",
                        name(i),
                        self.cluster.log(i).display()
                    );
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(())
    }

    /// Waits until each agent's links have probed their paths (one line
    /// each in its log), so that the figures timed next are not those of a
    /// session's first second: its probes' bytes, and the copies it makes
    /// while its path has not told whether it loses packets. A link whose
    /// peer refused its copy stream probes nothing: past `timeout` the
    /// figures are timed anyway.
    pub fn wait_paths_probed(&self, agents: &[usize], timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        for &i in agents {
            loop {
                let log = std::fs::read_to_string(self.cluster.log(i))
                    .with_context(|| format!("cannot read {}", self.cluster.log(i).display()))?;
                // Each link once (a reconnect's session probes again).
                let probed: std::collections::BTreeSet<&str> = log
                    .lines()
                    .filter(|l| l.contains("the link probed its path"))
                    .filter_map(|l| l.split("peer=").nth(1)?.split([' ', '}']).next())
                    .collect();
                if probed.len() >= agents.len() - 1 {
                    break;
                }
                if Instant::now() > deadline {
                    eprintln!("{}'s links had not all probed their paths within {timeout:?}: timing anyway", name(i));
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }
}

/// Serves metrics on the namespace's loopback and sets the anti-entropy
/// interval if the benchmark shortens it.
fn tune(config: &Path, anti_entropy: Option<Duration>) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config)?;
    // Top-level keys come before the first table.
    let mut text = format!("metrics_listen = \"127.0.0.1:{METRICS_PORT}\"\n{text}");
    if let Some(interval) = anti_entropy {
        let line = format!("[timings]\nanti_entropy_interval = \"{}ms\"\n", interval.as_millis());
        if !text.contains("[timings]\n") {
            bail!("{} has no [timings] table", config.display());
        }
        text = text.replacen("[timings]\n", &line, 1);
    }
    std::fs::write(config, text)?;
    Ok(())
}

/// `GET /metrics` over plain HTTP/1.1.
fn scrape(address: SocketAddr) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))
        .with_context(|| format!("cannot connect to the metrics endpoint {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").context("no HTTP header in the metrics answer")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("metrics endpoint answered {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_string())
}
