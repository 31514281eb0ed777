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
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary())
            .args(["run", "--config"])
            .arg(config)
            .env("SALT_KEYSYNC_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap();
        AgentProcess { child, log }
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
