//! Runs the real `salt-keysync` binary as separate processes, killed (and
//! their process group ended) when dropped, also when a test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The binary cargo built next to the test executable.
pub fn binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).expect("test binary lives in target/<profile>/deps");
    let bin = dir.join("salt-keysync");
    assert!(bin.exists(), "{} not built: run the tests with `cargo test --workspace`", bin.display());
    bin
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
        AgentProcess::start_with_env(config, log, &[])
    }

    /// Starts with extra environment variables (e.g. a fake systemd's NOTIFY_SOCKET).
    pub fn start_with_env(config: &Path, log: PathBuf, env: &[(&str, &str)]) -> AgentProcess {
        let log_file = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&log).unwrap()
        };
        let child = Command::new(binary())
            .args(["run", "--config"])
            .arg(config)
            .envs(env.iter().copied())
            .env("SALT_KEYSYNC_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap();
        AgentProcess { child, log }
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
        let ca = keysync_server::CertAuthority::new("ca").unwrap();
        let addrs: Vec<std::net::SocketAddr> = (0..n).map(|_| free_addr()).collect();
        let files: Vec<_> = (0..n)
            .map(|i| {
                let peers: Vec<(String, std::net::SocketAddr)> =
                    (0..n).filter(|&j| j != i).map(|j| (crate::cluster::NAMES[j].to_string(), addrs[j])).collect();
                crate::cluster::write_agent_files(root, &ca, crate::cluster::NAMES[i], addrs[i], &peers)
            })
            .collect();
        for f in &files {
            prepare(f);
        }
        let agents = files.iter().map(|f| AgentProcess::start(&f.config_path, f.dir.join("agent.log"))).collect();
        ProcessCluster { files, agents }
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

/// A loopback address nothing listens on right now.
pub fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}
