//! Real Salt daemons for end-to-end tests: the venvs `tests/salt/venv.sh`
//! makes, salt-master / salt-minion processes each in its own process group
//! (ended as a group on drop, also when a test panics), and a three-master
//! cluster with a salt-keysync agent beside each master.
//!
//! Salt's CLIs are Python programs that cost one to three seconds of CPU per
//! call on a loaded machine, so checks poll the key folders directly first and
//! confirm with `salt-key -L` once.

pub mod harness;
pub mod master;
pub mod minion;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use harness::SaltCluster;
pub use master::{KeyList, SaltMaster};
pub use minion::SaltMinion;

/// The Salt releases the suite runs against, newest first.
pub const VERSIONS: [&str; 3] = ["3008.3", "3007.15", "3006.28"];

/// The loopback addresses of masters A, B and C (Linux routes all of 127/8 to lo).
pub const MASTER_IPS: [Ipv4Addr; 3] =
    [Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3), Ipv4Addr::new(127, 0, 0, 4)];

/// `<target>/salt-venvs/<version>`, where `tests/salt/venv.sh` puts a venv.
/// A missing venv is a failure that names the command making it, never a skip.
pub fn venv(version: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).expect("test binary lives in target/<profile>/deps");
    let venv = target.join("salt-venvs").join(version);
    let salt_key = venv.join("bin/salt-key");
    assert!(
        salt_key.exists() && venv.join(".salt-keysync-ok").exists(),
        "no Salt {version} venv at {}: run `tests/salt/venv.sh {version}` (./scripts/test.sh does)",
        venv.display()
    );
    venv
}

/// A program from the Salt `version` venv (`salt-master`, `salt-key`, `python`, ...).
pub fn tool(version: &str, name: &str) -> PathBuf {
    venv(version).join("bin").join(name)
}

/// Runs a Salt CLI to completion; its exit code says little (salt-key exits 0
/// even when it did nothing), so callers check output or files.
pub fn run_tool(version: &str, name: &str, args: &[&str]) -> Output {
    Command::new(tool(version, name))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {name} from Salt {version}: {e}"))
}

/// The first JSON document in Salt CLI output: salt prints warnings such as
/// "No minions matched the target." before the JSON.
pub fn json_in(stdout: &[u8]) -> Option<serde_json::Value> {
    let text = String::from_utf8_lossy(stdout);
    let start = text.find('{')?;
    serde_json::Deserializer::from_str(&text[start..]).into_iter().next()?.ok()
}

/// A port free on every one of `ips` (masters on .2, .3 and .4 use the same
/// publish and return ports, as a minion expects): see
/// [`crate::binary::free_port_on`].
pub fn free_port_on_all(ips: &[Ipv4Addr]) -> u16 {
    crate::binary::free_port_on(ips)
}

/// A free address on `ip`.
pub fn free_addr_on(ip: Ipv4Addr) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(ip), crate::binary::free_port_on(&[ip]))
}

/// Polls `check` every `every` until it holds, or panics after `timeout`
/// with `what` and the last state `check` described. Blocking on purpose:
/// every check here runs a process or reads files.
pub fn wait_for(timeout: Duration, every: Duration, what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    loop {
        let last = match check() {
            Ok(()) => {
                if start.elapsed() > Duration::from_secs(2) {
                    eprintln!("    {:5.1} s until {what}", start.elapsed().as_secs_f64());
                }
                return;
            }
            Err(state) => state,
        };
        if start.elapsed() > timeout {
            panic!("not true after {timeout:?}: {what}; last seen: {last}");
        }
        std::thread::sleep(every);
    }
}

/// Creates `dir` (and parents) with mode 0700, as the agent's start-up checks want.
pub fn private_dir(dir: &Path) {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).unwrap();
}

/// Writes `bytes` to a new file with `mode`.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    file.write_all(bytes).unwrap();
}

/// A daemon started as the leader of its own process group. Salt daemons fork
/// workers that can outlive a signal to the parent, so the whole group is
/// ended, and we wait until no process of it is left. Done on drop too, so a
/// panicking test leaves nothing behind.
pub struct Daemon {
    name: String,
    child: Option<Child>,
    /// stdout and stderr of the daemon.
    pub out: PathBuf,
}

impl Daemon {
    pub fn spawn(name: &str, mut command: Command, out: PathBuf) -> Daemon {
        use std::os::unix::process::CommandExt;
        let file = std::fs::File::create(&out).unwrap();
        let child = command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Daemon { name: name.into(), child: Some(child), out }
    }

    /// Whether the group leader still runs.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Waits up to `timeout` for the leader to exit; `None` if it still runs.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().ok().flatten() {
                self.stop();
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ends the whole process group with SIGKILL (idempotent) and waits until
    /// none of its processes is left. Nothing here needs a graceful Salt
    /// shutdown, and SIGTERM costs seconds per daemon.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let pgid = child.id() as i32;
        let group = rustix::process::Pid::from_raw(pgid).expect("a child's pid is positive");
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        let _ = child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while group_alive(pgid) {
            if Instant::now() > deadline {
                eprintln!("warning: processes of {} (group {pgid}) still alive after SIGKILL", self.name);
                break;
            }
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether any process (zombies aside) is in process group `pgid`.
fn group_alive(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    entries.flatten().any(|entry| {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { return false };
        // pid (comm) state ppid pgrp ...: comm may hold spaces, so split after ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else { return false };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields.len() > 2 && fields[0] != "Z" && fields[2].parse() == Ok(pgid)
    })
}
