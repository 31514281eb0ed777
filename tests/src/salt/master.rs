//! One real salt-master on its own loopback address, with its own root_dir,
//! pki_dir, cachedir, sock_dir and pidfile, driven with `salt-key` and `salt`.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{json_in, private_dir, run_tool, tool, wait_for, write_file, Daemon};

/// The shared publish and return ports of all masters of one cluster.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    pub publish: u16,
    pub ret: u16,
}

/// Seconds between two runs of the master's maintenance loop, which rotates
/// the AES key when it finds `.dfn`. Low, so revocation is quick to observe.
pub const LOOP_INTERVAL_SECS: u64 = 1;

/// The master's request workers (MWorkers).
const WORKER_THREADS: usize = 2;

pub struct SaltMaster {
    pub version: String,
    /// The master's Salt `id`, also its agent's node name and what Salt 3008
    /// expects inside `.dfn`.
    pub id: String,
    pub ip: Ipv4Addr,
    pub ports: Ports,
    /// root_dir, and the `-c` folder holding the `master` config file.
    pub dir: PathBuf,
    pub pki: PathBuf,
    pub cachedir: PathBuf,
    daemon: Option<Daemon>,
    /// The length of its log when it was last started.
    log_at_start: usize,
}

impl SaltMaster {
    /// Writes the config and the shared master key pair under `dir` (short:
    /// Salt's IPC sockets live in `dir/sock`, and a Unix socket path has at
    /// most 107 bytes).
    pub fn new(version: &str, id: &str, ip: Ipv4Addr, ports: Ports, dir: PathBuf, master_key: &KeyPair) -> SaltMaster {
        let pki = dir.join("pki");
        let cachedir = dir.join("cache");
        private_dir(&pki);
        private_dir(&cachedir);
        private_dir(&dir.join("sock"));
        let d = dir.display();
        let sock = dir.join("sock/master_event_pub.ipc");
        assert!(sock.as_os_str().len() < 100, "socket path {} too long for a Unix socket", sock.display());
        let config = format!(
            "id: {id}\n\
             interface: {ip}\n\
             publish_port: {publish}\n\
             ret_port: {ret}\n\
             root_dir: {d}\n\
             pki_dir: {d}/pki\n\
             cachedir: {d}/cache\n\
             sock_dir: {d}/sock\n\
             pidfile: {d}/master.pid\n\
             log_file: {d}/master.log\n\
             log_level_logfile: info\n\
             key_logfile: {d}/key.log\n\
             user: root\n\
             worker_threads: {WORKER_THREADS}\n\
             loop_interval: {LOOP_INTERVAL_SECS}\n\
             timeout: 5\n\
             gather_job_timeout: 5\n",
            publish = ports.publish,
            ret = ports.ret,
        );
        write_file(&dir.join("master"), config.as_bytes(), 0o600);
        // A regular master.pem/master.pub before the first start: 3006 uses
        // them as they are, 3008 moves them to <id>.pem/.pub and links them.
        write_file(&pki.join("master.pem"), master_key.private.as_bytes(), 0o400);
        write_file(&pki.join("master.pub"), master_key.public.as_bytes(), 0o644);
        SaltMaster {
            version: version.into(),
            id: id.into(),
            ip,
            ports,
            dir,
            pki,
            cachedir,
            daemon: None,
            log_at_start: 0,
        }
    }

    pub fn start(&mut self) {
        assert!(self.daemon.is_none(), "{} already runs", self.id);
        let _ = std::fs::remove_file(self.dir.join("master.pid"));
        self.log_at_start = self.log().len();
        let mut command = Command::new(tool(&self.version, "salt-master"));
        command.arg("-c").arg(&self.dir).args(["-l", "quiet"]);
        self.daemon = Some(Daemon::spawn(&format!("salt-master {}", self.id), command, self.dir.join("master.out")));
    }

    /// Waits until the master accepts connections on its return port and
    /// its request workers are up. The port opens first (seconds before the
    /// workers on a loaded machine): what a minion sends meanwhile is queued,
    /// and answered together with its retries.
    pub fn wait_ready(&mut self) {
        let log = self.dir.join("master.log");
        let log_at_start = self.log_at_start;
        let addr = (self.ip, self.ports.ret).into();
        let sock = self.dir.join("sock/master_event_pub.ipc");
        let id = self.id.clone();
        let daemon = self.daemon.as_mut().expect("master started");
        wait_for(Duration::from_secs(90), Duration::from_millis(200), &format!("salt-master {id} ready"), || {
            if !daemon.is_running() {
                panic!("salt-master {id} exited: {}", std::fs::read_to_string(&daemon.out).unwrap_or_default());
            }
            let up = sock.exists() && TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok();
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let workers = text.get(log_at_start..).unwrap_or_default().matches("Worker binding to socket").count();
            if !up {
                Err("return port closed".into())
            } else if workers < WORKER_THREADS {
                Err(format!("{workers} of {WORKER_THREADS} request workers up"))
            } else {
                Ok(())
            }
        });
    }

    pub fn stop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            daemon.stop();
        }
    }

    /// `salt-key -c <dir> ARGS -y`. Its exit code is 0 even when it did
    /// nothing, and 3006 prints harmless asyncio tracebacks at exit, so the
    /// callers check the key folders and `salt-key -L` instead.
    pub fn salt_key(&self, args: &[&str]) -> String {
        let mut full = vec!["-c", self.dir.to_str().unwrap()];
        full.extend_from_slice(args);
        full.push("-y");
        let out = run_tool(&self.version, "salt-key", &full);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// How many times the master logged an accepted authentication of `minion`
    /// (cheap to poll, unlike `salt`, which costs seconds of CPU per run).
    pub fn n_auth_accepted(&self, minion: &str) -> usize {
        self.log().matches(&format!("Authentication accepted from {minion}\n")).count()
    }

    /// `salt-key -L` as this master sees it.
    pub fn list(&self) -> KeyList {
        let out = run_tool(&self.version, "salt-key", &["-c", self.dir.to_str().unwrap(), "-L", "--out=json"]);
        let json = json_in(&out.stdout).unwrap_or_else(|| {
            panic!(
                "salt-key -L on {} printed no JSON:\n{}\n{}",
                self.id,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        KeyList::from_json(&json)
    }

    /// `salt <target> test.ping` from this master: the minions that answered
    /// True. A minion that did not return, or no minion matching, is absent.
    pub fn ping(&self, target: &str) -> BTreeSet<String> {
        let out = run_tool(
            &self.version,
            "salt",
            &["-c", self.dir.to_str().unwrap(), target, "test.ping", "--out=json", "--static", "-t", "6"],
        );
        let Some(serde_json::Value::Object(answers)) = json_in(&out.stdout) else { return BTreeSet::new() };
        answers.into_iter().filter(|(_, v)| v == &serde_json::Value::Bool(true)).map(|(k, _)| k).collect()
    }

    /// Which of the three folders holds `id`, read from disk (cheap, for polling).
    pub fn folder_of(&self, id: &str) -> Option<&'static str> {
        crate::salt_ops::find(&self.pki, id).map(|(folder, _)| folder)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("master.log")).unwrap_or_default()
    }

    pub fn dfn(&self) -> PathBuf {
        self.cachedir.join(".dfn")
    }
}

/// What `salt-key -L --out=json` lists (the order of its keys differs between
/// Salt lines, so it is parsed, not compared as text).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyList {
    pub accepted: BTreeSet<String>,
    pub pending: BTreeSet<String>,
    pub rejected: BTreeSet<String>,
}

impl KeyList {
    fn from_json(json: &serde_json::Value) -> KeyList {
        let set = |key: &str| -> BTreeSet<String> {
            json.get(key)
                .and_then(|v| v.as_array())
                .map(|ids| ids.iter().filter_map(|id| id.as_str().map(String::from)).collect())
                .unwrap_or_default()
        };
        KeyList { accepted: set("minions"), pending: set("minions_pre"), rejected: set("minions_rejected") }
    }

    /// "accepted", "pending", "rejected" or "absent" for `id`.
    pub fn state_of(&self, id: &str) -> &'static str {
        if self.rejected.contains(id) {
            "rejected"
        } else if self.accepted.contains(id) {
            "accepted"
        } else if self.pending.contains(id) {
            "pending"
        } else {
            "absent"
        }
    }
}

/// A PEM key pair as Salt writes it.
#[derive(Clone, Debug)]
pub struct KeyPair {
    pub private: String,
    pub public: String,
}

impl KeyPair {
    /// Reads `<dir>/<name>.pem` and `.pub`.
    pub fn read(dir: &Path, name: &str) -> KeyPair {
        let read = |ext: &str| {
            let path = dir.join(format!("{name}.{ext}"));
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        };
        KeyPair { private: read("pem"), public: read("pub") }
    }
}
