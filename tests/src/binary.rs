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
        AgentProcess::start_logging(config, log, "info")
    }

    /// Starts with `SALT_KEYSYNC_LOG=filter` (the benchmark logs less).
    pub fn start_logging(config: &Path, log: PathBuf, filter: &str) -> AgentProcess {
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary())
            .args(["run", "--config"])
            .arg(config)
            .env("SALT_KEYSYNC_LOG", filter)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap();
        AgentProcess { child, log }
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

    /// Stops every agent with SIGTERM and asserts a clean exit.
    pub fn stop(self) {
        for agent in self.agents {
            let log = agent.log.clone();
            let status = agent.stop();
            assert!(status.success(), "agent exited with {status}: {}", std::fs::read_to_string(log).unwrap());
        }
    }
}

/// A loopback address nothing listens on right now.
pub fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}
