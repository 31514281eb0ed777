//! Runs the real `salt-keysync` binary as separate processes, killed (and
//! their process group ended) when dropped, also when a test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The binary cargo built next to the running executable: a test in
/// `target/<profile>/deps/`, or a program such as the benchmark in
/// `target/<profile>/`. `SALT_KEYSYNC_BIN` overrides.
pub fn binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("SALT_KEYSYNC_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().expect("the executable lives in a folder");
    let candidates = [dir.join("salt-keysync"), dir.parent().map(|d| d.join("salt-keysync")).unwrap_or_default()];
    let found = candidates.iter().find(|bin| bin.is_file());
    found
        .cloned()
        .unwrap_or_else(|| panic!("{} not built: run the tests with `cargo test --workspace`", candidates[1].display()))
}

/// Runs `salt-keysync ARGS` to completion.
pub fn run_cli(args: &[&str]) -> Output {
    Command::new(binary()).args(args).output().unwrap()
}

/// An agent process, stopped on drop.
pub struct AgentProcess {
    child: Child,
    pub log: PathBuf,
}

impl AgentProcess {
    pub fn start(config: &Path, log: PathBuf) -> AgentProcess {
        AgentProcess::launch(config, log, &[], "info", false, &[])
    }

    /// Starts with extra environment variables (e.g. a fake systemd's NOTIFY_SOCKET).
    pub fn start_with_env(config: &Path, log: PathBuf, env: &[(&str, &str)]) -> AgentProcess {
        AgentProcess::launch(config, log, env, "info", false, &[])
    }

    /// Starts with extra environment (the test-only fault knobs), appending
    /// its output to `log` (kept across restarts).
    pub fn start_with(config: &Path, log: PathBuf, env: &[(String, String)]) -> AgentProcess {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        AgentProcess::launch(config, log, &env, "info", true, &[])
    }

    /// Starts with `SALT_KEYSYNC_LOG=filter` (the benchmark logs less).
    pub fn start_logging(config: &Path, log: PathBuf, filter: &str) -> AgentProcess {
        AgentProcess::launch(config, log, &[], filter, false, &[])
    }

    /// Starts as `wrapper... <binary> run --config config` (the benchmark
    /// runs each agent in a mount namespace laid out as the unit makes it).
    pub fn start_wrapped(config: &Path, log: PathBuf, filter: &str, wrapper: &[std::ffi::OsString]) -> AgentProcess {
        AgentProcess::launch(config, log, &[], filter, false, wrapper)
    }

    /// `run --config config`, its output in `log` (mode 0600), truncated or appended.
    fn launch(
        config: &Path,
        log: PathBuf,
        env: &[(&str, &str)],
        filter: &str,
        append: bool,
        wrapper: &[std::ffi::OsString],
    ) -> AgentProcess {
        let log_file = {
            use std::os::unix::fs::OpenOptionsExt;
            let mut options = std::fs::OpenOptions::new();
            options.create(true).mode(0o600);
            if append {
                options.append(true);
            } else {
                options.write(true).truncate(true);
            }
            options.open(&log).unwrap()
        };
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary());
                command
            }
            None => Command::new(binary()),
        };
        let child = command
            .args(["run", "--config"])
            .arg(config)
            .env("SALT_KEYSYNC_LOG", filter)
            // Plain test logs even when the tests themselves run under systemd.
            .env_remove("JOURNAL_STREAM")
            // After the defaults: a test's own SALT_KEYSYNC_LOG or JOURNAL_STREAM wins.
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap();
        AgentProcess { child, log }
    }

    /// SIGKILL: no chance to flush or clean anything, as in a power cut of
    /// the process (the file system itself survives).
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::forget(self);
    }

    /// The exit status if the process has ended.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Sends a signal by name (`HUP`, `TERM`, ...).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status().unwrap();
        assert!(status.success(), "kill -{name} {} failed", self.child.id());
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops with SIGTERM and returns the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let status = self.child.wait().unwrap();
        std::mem::forget(self);
        status
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three (or `n`) agent processes with files under `root`, each peering with
/// all others on free loopback ports.
pub struct ProcessCluster {
    pub files: Vec<crate::cluster::AgentFiles>,
    agents: Vec<AgentProcess>,
}

impl ProcessCluster {
    /// Writes the agents' files and lets `prepare` touch them before start.
    pub fn start(root: &Path, n: usize, prepare: impl Fn(&crate::cluster::AgentFiles)) -> ProcessCluster {
        let files = ProcessCluster::write_files(root, n);
        for f in &files {
            prepare(f);
        }
        let agents = files.iter().map(|f| AgentProcess::start(&f.config_path, f.dir.join("agent.log"))).collect();
        ProcessCluster { files, agents }
    }

    /// The files of `n` agents that peer with each other, none started: for
    /// callers that start them one by one (the benchmark's join).
    pub fn write_files(root: &Path, n: usize) -> Vec<crate::cluster::AgentFiles> {
        let ca = keysync_server::CertAuthority::new("ca").unwrap();
        let addrs: Vec<std::net::SocketAddr> = (0..n).map(|_| free_addr()).collect();
        (0..n)
            .map(|i| {
                let peers: Vec<(String, std::net::SocketAddr)> =
                    (0..n).filter(|&j| j != i).map(|j| (crate::cluster::NAMES[j].to_string(), addrs[j])).collect();
                crate::cluster::write_agent_files(root, &ca, crate::cluster::NAMES[i], addrs[i], &peers)
            })
            .collect()
    }

    /// Waits until every agent logged its start.
    pub async fn started(&self) {
        for agent in &self.agents {
            crate::wait_until(std::time::Duration::from_secs(20), "agent started", || {
                std::fs::read_to_string(&agent.log).is_ok_and(|text| text.contains("agent started"))
            })
            .await;
        }
    }

    /// The agent at `idx`.
    pub fn agent(&mut self, idx: usize) -> &mut AgentProcess {
        &mut self.agents[idx]
    }

    /// Sends a signal by name to the agent at `idx`.
    pub fn signal(&self, idx: usize, name: &str) {
        self.agents[idx].signal(name);
    }

    /// Stops every agent with SIGTERM and asserts a clean exit.
    pub fn stop(self) {
        for agent in self.agents {
            let log = agent.log.clone();
            let status = agent.stop();
            assert!(status.success(), "agent exited with {status}: {}", std::fs::read_to_string(log).unwrap());
        }
    }
}

/// A loopback address nothing listens on right now, for an agent that binds
/// it later. Not one the kernel hands out by itself (port 0, or the source
/// port of an outgoing connection, both from ip_local_port_range, 32768 and
/// up): between this check and the agent's bind, another test's connection
/// could take such a port ("Address already in use", seen in the fault
/// suite). Ports 20000–31999 instead, each handed out once per process, from
/// an offset per process.
pub fn free_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], free_port_on(&[std::net::Ipv4Addr::LOCALHOST])))
}

/// A port free on every one of `ips` (loopback addresses), from the same
/// range and counter as [`free_addr`]: the real-Salt tests run three
/// clusters at once on the same addresses, and ports from the ephemeral
/// range collided there too ("cannot listen on 127.0.0.3:37909: Address
/// already in use").
pub fn free_port_on(ips: &[std::net::Ipv4Addr]) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
    for _ in 0..SPAN {
        let port = (FIRST + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if ips.iter().all(|ip| std::net::TcpListener::bind((*ip, port)).is_ok()) {
            return port;
        }
    }
    panic!("no free port on {ips:?} in {FIRST}..{}", FIRST + SPAN);
}

/// Agent processes whose peers are reached through cuttable relays, and that
/// a test can kill -9, stop and restart one by one (the fault suite).
pub struct FaultCluster {
    pub files: Vec<crate::cluster::AgentFiles>,
    agents: Vec<Option<AgentProcess>>,
    /// Extra environment per agent, used at its next start.
    pub env: Vec<Vec<(String, String)>>,
    n_starts: Vec<usize>,
    /// Relay from agent i to agent j.
    links: crate::proxy::Relays,
}

impl FaultCluster {
    /// Writes `n` agents' files under `root` (each peer behind a relay) and
    /// lets `prepare` change them; starts nothing.
    pub async fn create(root: &Path, n: usize, prepare: impl Fn(usize, &crate::cluster::AgentFiles)) -> FaultCluster {
        let ca = keysync_server::CertAuthority::new("ca").unwrap();
        let addrs: Vec<std::net::SocketAddr> = (0..n).map(|_| free_addr()).collect();
        let links = crate::proxy::Relays::start(&addrs).await;
        let files: Vec<_> = (0..n)
            .map(|i| {
                let peers: Vec<(String, std::net::SocketAddr)> = (0..n)
                    .filter(|&j| j != i)
                    .map(|j| (crate::cluster::NAMES[j].to_string(), links.addr(i, j)))
                    .collect();
                crate::cluster::write_agent_files(root, &ca, crate::cluster::NAMES[i], addrs[i], &peers)
            })
            .collect();
        for (i, f) in files.iter().enumerate() {
            prepare(i, f);
        }
        FaultCluster {
            agents: (0..n).map(|_| None).collect(),
            env: vec![Vec::new(); n],
            n_starts: vec![0; n],
            files,
            links,
        }
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    pub fn log(&self, idx: usize) -> PathBuf {
        self.files[idx].dir.join("agent.log")
    }

    pub fn is_running(&self, idx: usize) -> bool {
        self.agents[idx].is_some()
    }

    /// Starts agent `idx` and waits until it logged its start.
    pub async fn start(&mut self, idx: usize) {
        self.spawn(idx);
        self.started(idx).await;
    }

    /// Starts agent `idx` without waiting.
    pub fn spawn(&mut self, idx: usize) {
        assert!(self.agents[idx].is_none(), "agent {idx} is already running");
        let agent = AgentProcess::start_with(&self.files[idx].config_path, self.log(idx), &self.env[idx]);
        self.agents[idx] = Some(agent);
        self.n_starts[idx] += 1;
    }

    /// Waits until agent `idx` logged its latest start; panics with its log
    /// if it exits first.
    pub async fn started(&mut self, idx: usize) {
        let want = self.n_starts[idx];
        let log = self.log(idx);
        let start = std::time::Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.matches("agent started").count() >= want {
                return;
            }
            if let Some(status) = self.agents[idx].as_mut().and_then(AgentProcess::try_wait) {
                panic!("agent {idx} exited with {status} before starting:\n{text}");
            }
            assert!(start.elapsed() < std::time::Duration::from_secs(60), "agent {idx} not started in 60 s:\n{text}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    pub async fn start_all(&mut self) {
        for idx in 0..self.len() {
            self.spawn(idx);
        }
        for idx in 0..self.len() {
            self.started(idx).await;
        }
    }

    /// Starts agent `idx` expecting it to refuse: returns its exit code and
    /// what it printed at this start.
    pub async fn start_refused(&mut self, idx: usize) -> (Option<i32>, String) {
        let before = std::fs::read_to_string(self.log(idx)).unwrap_or_default().len();
        self.spawn(idx);
        self.n_starts[idx] -= 1; // a refused start logs no "agent started"
        let mut agent = self.agents[idx].take().unwrap();
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(status) = agent.try_wait() {
                break status;
            }
            assert!(start.elapsed() < std::time::Duration::from_secs(30), "agent {idx} did not refuse to start");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        std::mem::forget(agent);
        let text = std::fs::read_to_string(self.log(idx)).unwrap_or_default();
        (status.code(), text[before..].to_string())
    }

    pub fn kill9(&mut self, idx: usize) {
        self.agents[idx].take().expect("agent is running").kill9();
    }

    /// Sends agent `idx` a signal (`"HUP"`: reload its config).
    pub fn signal(&self, idx: usize, name: &str) {
        self.agents[idx].as_ref().expect("agent is running").signal(name);
    }

    /// SIGTERM, and a clean exit asserted.
    pub fn stop(&mut self, idx: usize) {
        let agent = self.agents[idx].take().expect("agent is running");
        let status = agent.stop();
        assert!(
            status.success(),
            "agent {idx} exited with {status}: {}",
            std::fs::read_to_string(self.log(idx)).unwrap()
        );
    }

    /// Cuts the relays both ways between `i` and `j`.
    pub fn cut(&self, i: usize, j: usize) {
        self.links.cut(i, j);
    }

    /// Cuts only agent `i`'s link to agent `j`: `j` still reaches `i`.
    pub fn cut_one_way(&self, i: usize, j: usize) {
        self.links.cut_one_way(i, j);
    }

    /// Cuts every relay between agents of different groups.
    pub fn partition(&self, groups: &[&[usize]]) {
        self.links.partition(groups);
    }

    pub fn heal(&self) {
        self.links.heal();
    }

    /// Stops every running agent with SIGTERM.
    pub fn stop_all(&mut self) {
        for idx in 0..self.len() {
            if self.is_running(idx) {
                self.stop(idx);
            }
        }
    }
}
