//! In-process agent clusters: one call starts N agents in a temp dir, each
//! with its own pki folders, state and certificates made at test time, and
//! its peers reached through relays the test can cut (partitions).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use keysync_server::CertAuthority;
use salt_keysync::config::Config;
use salt_keysync::disk::audit::{read_verified, Record};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::proxy::Relays;
use crate::salt_ops::FOLDERS;

pub const NAMES: [&str; 5] = ["master-a", "master-b", "master-c", "master-d", "master-e"];

/// Everything on disk that makes up one agent's world.
pub struct AgentFiles {
    pub name: String,
    pub dir: PathBuf,
    pub pki: PathBuf,
    pub config_path: PathBuf,
    pub audit_log: PathBuf,
}

/// Writes certificates, pki folders, a config (the keys of packaging/config.toml) and the salt-master
/// config it names for `name` under `root/name`. `peers`: (name, address) pairs.
pub fn write_agent_files(
    root: &Path,
    ca: &CertAuthority,
    name: &str,
    listen: SocketAddr,
    peers: &[(String, SocketAddr)],
) -> AgentFiles {
    let dir = root.join(name);
    let pki = dir.join("pki");
    // The modes the agent's start-up check demands, whatever the umask:
    // pki_dir 0700 and key folders 0755 as the salt-master makes them.
    mkdir(&dir, 0o700);
    mkdir(&pki, 0o700);
    for folder in FOLDERS {
        mkdir(&pki.join(folder), 0o755);
    }
    mkdir(&dir.join("cache"), 0o700);
    let now = time::OffsetDateTime::now_utc();
    let issued = ca.issue(&[name], now - time::Duration::hours(1), now + time::Duration::days(1)).unwrap();
    write_private(&dir.join("ca.pem"), ca.cert_pem());
    write_private(&dir.join("node.pem"), &issued.cert_pem);
    write_private(&dir.join("node.key"), &issued.key_pem);
    let mut config = format!(
        r#"node = "{name}"
pki_dir = "{pki}"
state_dir = "{dir}/state"
listen = "{listen}"

[tls]
ca = "{dir}/ca.pem"
cert = "{dir}/node.pem"
key = "{dir}/node.key"

[salt]
cachedir = "{dir}/cache"
master_id = "{name}_master"
master_config = "{dir}/salt-master.conf"

[timings]
anti_entropy_interval = "1s"
reconnect_max = "300ms"
rescan_interval = "1h"
"#,
        pki = pki.display(),
        dir = dir.display(),
    );
    for (peer, address) in peers {
        config.push_str(&format!("\n[[peer]]\nname = \"{peer}\"\naddress = \"{address}\"\n"));
    }
    let config_path = dir.join("config.toml");
    write_private(&config_path, config);
    // The master config the agent's config names must exist (a named one
    // that does not is refused): this test master's has every setting at
    // Salt's default. Tests write their own settings over it.
    write_private(&dir.join("salt-master.conf"), "# this test master's config: Salt's defaults\n");
    AgentFiles { name: name.into(), audit_log: dir.join("state/audit.jsonl"), dir, pki, config_path }
}

fn mkdir(path: &Path, mode: u32) {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(mode).create(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Writes a file only its owner can read (mode 0600 from creation on).
pub fn write_private(path: &Path, contents: impl AsRef<[u8]>) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).unwrap();
    file.write_all(contents.as_ref()).unwrap();
}

pub struct TestAgent {
    pub files: AgentFiles,
    pub addr: SocketAddr,
    running: Option<(CancellationToken, JoinHandle<anyhow::Result<()>>)>,
}

impl TestAgent {
    pub fn pki(&self) -> &Path {
        &self.files.pki
    }

    pub fn name(&self) -> &str {
        &self.files.name
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    async fn start(&mut self, listener: Option<TcpListener>) {
        assert!(self.running.is_none(), "{} is already running", self.name());
        let listener = match listener {
            Some(listener) => listener,
            None => TcpListener::bind(self.addr).await.unwrap(),
        };
        let config = Config::load(&self.files.config_path).unwrap();
        let starts = |agent: &TestAgent| {
            read_verified(&agent.files.audit_log)
                .map_or(0, |records| records.iter().filter(|r| r.action == "start").count())
        };
        let before = starts(self);
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(salt_keysync::agent::run(config, Some(listener), shutdown.clone()));
        self.running = Some((shutdown, handle));
        // Started: its start-up reconciliation is done and it listens. A test
        // that changes the folders before would race the reconciliation.
        let what = format!("{} has started", self.name());
        crate::wait_until(Duration::from_secs(30), &what, || starts(self) > before).await;
    }

    async fn stop(&mut self) {
        let (shutdown, handle) = self.running.take().expect("agent is running");
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), handle)
            .await
            .expect("agent stops within 10 s")
            .expect("agent task did not panic")
            .expect("agent ran without error");
    }

    /// The audit log, with its hash chain verified.
    pub fn audit(&self) -> Vec<Record> {
        read_verified(&self.files.audit_log).unwrap()
    }
}

pub struct TestCluster {
    pub agents: Vec<TestAgent>,
    /// Relay from agent i to agent j.
    links: Relays,
    pub root: tempfile::TempDir,
    /// The CA that issued every agent's certificate (tests issue strangers' too).
    pub ca: CertAuthority,
}

impl TestCluster {
    pub async fn start(n: usize) -> TestCluster {
        let root = tempfile::tempdir().unwrap();
        let ca = CertAuthority::new("test CA").unwrap();
        let mut listeners = Vec::new();
        for _ in 0..n {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let links = Relays::start(&addrs).await;
        let mut agents = Vec::new();
        for i in 0..n {
            let peers: Vec<(String, SocketAddr)> =
                (0..n).filter(|&j| j != i).map(|j| (NAMES[j].to_string(), links.addr(i, j))).collect();
            let files = write_agent_files(root.path(), &ca, NAMES[i], addrs[i], &peers);
            agents.push(TestAgent { files, addr: addrs[i], running: None });
        }
        for (agent, listener) in agents.iter_mut().zip(listeners) {
            agent.start(Some(listener)).await;
        }
        TestCluster { agents, links, root, ca }
    }

    pub fn pki(&self, idx: usize) -> &Path {
        self.agents[idx].pki()
    }

    pub async fn stop(&mut self, idx: usize) {
        self.agents[idx].stop().await;
    }

    pub async fn restart(&mut self, idx: usize) {
        self.agents[idx].start(None).await;
    }

    /// Cuts every link between agents of different groups.
    pub fn partition(&self, groups: &[&[usize]]) {
        self.links.partition(groups);
    }

    pub fn heal(&self) {
        self.links.heal();
    }

    /// Cuts only agent `i`'s link to agent `j`: `j` still reaches `i`.
    pub fn cut_one_way(&self, i: usize, j: usize) {
        self.links.cut_one_way(i, j);
    }

    /// Forwards what agent `i` sends agent `j` at most at `bytes_per_sec`
    /// per connection (`None`: as it comes); see [`crate::proxy::Link::throttle`].
    pub fn throttle(&self, i: usize, j: usize, bytes_per_sec: Option<usize>) {
        self.links.throttle(i, j, bytes_per_sec);
    }

    /// The most bytes one connection from agent `i` to agent `j` holds in
    /// its relay, not forwarded yet.
    pub fn most_held(&self, i: usize, j: usize) -> usize {
        self.links.most_held(i, j)
    }

    pub async fn shutdown(mut self) {
        for idx in 0..self.agents.len() {
            if self.agents[idx].is_running() {
                self.stop(idx).await;
            }
        }
    }
}
