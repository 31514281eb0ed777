//! Three real salt-masters (127.0.0.2, .3, .4) sharing one master key pair, a
//! salt-keysync agent beside each with real mTLS, and real minions that list
//! all three masters. One cluster per Salt version; scenarios run in sequence
//! on it. Dropping the cluster ends every process, also when a test panics,
//! and then keeps the folder (logs) for a failed test and removes it otherwise.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use keysync_server::CertAuthority;

use super::master::{KeyPair, Ports};
use super::{free_addr_on, free_port_on_all, private_dir, tool, wait_for, write_file, Daemon, MASTER_IPS};
use super::{SaltMaster, SaltMinion};
use crate::binary::AgentProcess;

/// The masters' ids, which are also their agents' node names.
pub const MASTER_IDS: [&str; 3] = ["master-a", "master-b", "master-c"];

/// Salt's own key generator, many keys per interpreter start.
fn gen_keys_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("salt/gen-keys.py")
}

/// Starts `tests/salt/gen-keys.py DIR PREFIX COUNT` in the background.
fn gen_keys(version: &str, dir: &Path, prefix: &str, count: usize, out: PathBuf) -> Daemon {
    private_dir(dir);
    let mut command = Command::new(tool(version, "python"));
    command.arg(gen_keys_script()).arg(dir).arg(prefix).arg(count.to_string());
    Daemon::spawn(&format!("gen-keys {prefix}"), command, out)
}

pub struct SaltCluster {
    pub version: String,
    // Field order is drop order: minions, then agents, then masters.
    minions: BTreeMap<String, SaltMinion>,
    agents: Vec<Option<AgentProcess>>,
    pub masters: Vec<SaltMaster>,
    agent_configs: Vec<PathBuf>,
    pub ports: Ports,
    /// Makes (or finds) the bulk keys in the background.
    bulk: Option<std::thread::JoinHandle<(PathBuf, Vec<String>)>>,
    bulk_keys: Option<(PathBuf, Vec<String>)>,
    root: Option<tempfile::TempDir>,
}

impl SaltCluster {
    /// Starts three masters, their agents and one minion per id in `minion_ids`,
    /// and begins generating `n_bulk` minion key pairs in the background
    /// (collected with [`SaltCluster::bulk_keys`]).
    pub fn start(version: &str, minion_ids: &[&str], n_bulk: usize) -> SaltCluster {
        super::venv(version);
        let root = tempfile::Builder::new().prefix("ske-").tempdir_in("/tmp").unwrap();
        let dir = root.path().to_path_buf();

        // One master key pair for all masters (Salt's multi-master requirement).
        let keygen_dir = dir.join("keys");
        let mut master_keygen = gen_keys(version, &keygen_dir, "master", 1, dir.join("gen-master.out"));
        let status = master_keygen.wait(Duration::from_secs(120));
        assert!(status.is_some_and(|s| s.success()), "gen-keys.py failed: {}", read(&dir.join("gen-master.out")));
        let master_key = KeyPair::read(&keygen_dir, "master0");
        let bulk = (n_bulk > 0).then(|| {
            let version = version.to_string();
            std::thread::spawn(move || cached_bulk_keys(&version, n_bulk))
        });

        let ports = Ports { publish: free_port_on_all(&MASTER_IPS), ret: free_port_on_all(&MASTER_IPS) };
        assert_ne!(ports.publish, ports.ret, "two free ports");
        let mut masters: Vec<SaltMaster> = (0..3)
            .map(|i| {
                let name = ["a", "b", "c"][i];
                SaltMaster::new(version, MASTER_IDS[i], MASTER_IPS[i], ports, dir.join(name), &master_key)
            })
            .collect();
        for master in &mut masters {
            master.start();
        }
        for master in &mut masters {
            master.wait_ready();
        }
        // Minions start once the masters are ready. A minion started before
        // sent authentications a starting master queued, and its retries
        // after their timeouts reached the master with them: two of the
        // master's workers, one writing the new pending key, the other
        // comparing it half-written ("the public key in pending did not
        // match"), and the minion, told it was rejected, exited (Salt
        // 3006.28 on a loaded machine, CI at 3e5efd2).
        let minions: BTreeMap<String, SaltMinion> = minion_ids
            .iter()
            .map(|id| {
                let mut minion = SaltMinion::new(version, id, &MASTER_IPS, ports, dir.join(format!("n-{id}")));
                minion.start();
                (id.to_string(), minion)
            })
            .collect();

        let agent_configs = write_agent_configs(&dir, &masters);
        let mut cluster = SaltCluster {
            version: version.into(),
            minions,
            agents: (0..3).map(|_| None).collect(),
            masters,
            agent_configs,
            ports,
            bulk,
            bulk_keys: None,
            root: Some(root),
        };
        for i in 0..3 {
            cluster.start_agent(i);
        }
        cluster
    }

    pub fn dir(&self) -> &Path {
        self.root.as_ref().expect("cluster folder").path()
    }

    pub fn minion(&mut self, id: &str) -> &mut SaltMinion {
        self.minions.get_mut(id).unwrap_or_else(|| panic!("no minion {id}"))
    }

    /// Starts agent `i` and waits until it logged its start.
    pub fn start_agent(&mut self, i: usize) {
        assert!(self.agents[i].is_none(), "agent {} already runs", MASTER_IDS[i]);
        let log = self.dir().join(format!("agent-{}.log", MASTER_IDS[i]));
        let agent = AgentProcess::start(&self.agent_configs[i], log.clone());
        self.agents[i] = Some(agent);
        wait_for(Duration::from_secs(30), Duration::from_millis(50), "agent started", || {
            let text = read(&log);
            if text.contains("agent started") {
                Ok(())
            } else {
                Err(text)
            }
        });
    }

    /// Runs `salt-keysync ARGS --config <agent i's config>` (the CLI an
    /// operator uses on that master); its stdout, failing the test if it fails.
    pub fn keysync(&self, i: usize, args: &[&str]) -> String {
        let (code, stdout, stderr) = self.keysync_exit(i, args);
        assert_eq!(code, Some(0), "salt-keysync {args:?} on {}: {stdout}{stderr}", MASTER_IDS[i]);
        stdout
    }

    /// [`SaltCluster::keysync`] for a command whose exit status is the
    /// point (`status` exits 3 for an error finding): the status, stdout
    /// and stderr.
    pub fn keysync_exit(&self, i: usize, args: &[&str]) -> (Option<i32>, String, String) {
        let config = self.agent_configs[i].to_str().unwrap();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--config", config]);
        let out = crate::binary::run_cli(&all);
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    }

    /// Stops agent `i` with SIGTERM; it must exit cleanly.
    pub fn stop_agent(&mut self, i: usize) {
        let agent = self.agents[i].take().unwrap_or_else(|| panic!("agent {} is not running", MASTER_IDS[i]));
        let log = agent.log.clone();
        let status = agent.stop();
        assert!(status.success(), "agent {} exited with {status}: {}", MASTER_IDS[i], read(&log));
    }

    /// Waits until every master's key folders hold `id` in `folder` (`None`:
    /// in none of them). Reads files: cheap enough to poll.
    pub fn wait_folder_everywhere(&self, id: &str, folder: Option<&str>, timeout: Duration) {
        for master in &self.masters {
            let what = format!("{id} in {folder:?} on {}", master.id);
            wait_for(timeout, Duration::from_millis(50), &what, || {
                let now = master.folder_of(id);
                if now == folder {
                    Ok(())
                } else {
                    Err(format!("{now:?}"))
                }
            });
        }
    }

    /// Asserts that `salt-key -L` on every master lists `id` as `state`.
    pub fn assert_listed_everywhere(&self, id: &str, state: &str) {
        for master in &self.masters {
            let list = master.list();
            assert_eq!(list.state_of(id), state, "salt-key -L on {} for {id}: {list:?}", master.id);
        }
    }

    /// Waits until `minion` answers `test.ping` with True from master `i`
    /// (the minion retries its authentication every second or two). Waits for
    /// the master to log the minion's accepted authentication first, so that
    /// `salt` (seconds of CPU per run) runs about once.
    pub fn wait_answers(&self, i: usize, minion: &str, timeout: Duration) {
        let master = &self.masters[i];
        let what = format!("{} accepts {minion}'s authentication", master.id);
        wait_for(timeout, Duration::from_millis(100), &what, || {
            if master.n_auth_accepted(minion) > 0 {
                Ok(())
            } else {
                Err("not in its log".into())
            }
        });
        let what = format!("{minion} answers test.ping from {}", master.id);
        wait_for(timeout, Duration::from_millis(500), &what, || {
            let answered = master.ping(minion);
            if answered.contains(minion) {
                Ok(())
            } else {
                Err(format!("answered: {answered:?}"))
            }
        });
    }

    /// The bulk public keys: waits for their generation, returns (folder, ids);
    /// `<folder>/<id>.pub` is the key of `<id>`.
    pub fn bulk_keys(&mut self) -> (PathBuf, Vec<String>) {
        if let Some(making) = self.bulk.take() {
            self.bulk_keys = Some(making.join().expect("making the bulk keys failed"));
        }
        self.bulk_keys.clone().expect("the cluster was started with bulk keys")
    }

    /// Stops everything; on a failed test keeps the folder and says where.
    fn shutdown(&mut self) {
        for minion in self.minions.values_mut() {
            minion.stop();
        }
        for agent in self.agents.iter_mut() {
            drop(agent.take());
        }
        for master in &mut self.masters {
            master.stop();
        }
        if let Some(root) = self.root.take() {
            if std::thread::panicking() {
                eprintln!("salt {}: logs kept in {}", self.version, root.keep().display());
            }
        }
    }
}

impl Drop for SaltCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Certificates from a CA made now, and one agent config per master: its
/// pki_dir, cachedir and id are the master's real ones (3008 refuses a `.dfn`
/// holding another id). Files 0600, folders 0700.
fn write_agent_configs(dir: &Path, masters: &[SaltMaster]) -> Vec<PathBuf> {
    let ca = CertAuthority::new("salt-keysync e2e CA").unwrap();
    let now = time::OffsetDateTime::now_utc();
    let addrs: Vec<_> = masters.iter().map(|m| free_addr_on(m.ip)).collect();
    masters
        .iter()
        .enumerate()
        .map(|(i, master)| {
            let agent_dir = dir.join(format!("k-{}", master.id));
            private_dir(&agent_dir.join("state"));
            let issued =
                ca.issue(&[&master.id], now - time::Duration::hours(1), now + time::Duration::days(1)).unwrap();
            write_file(&agent_dir.join("ca.pem"), ca.cert_pem().as_bytes(), 0o600);
            write_file(&agent_dir.join("node.pem"), issued.cert_pem.as_bytes(), 0o600);
            write_file(&agent_dir.join("node.key"), issued.key_pem.as_bytes(), 0o600);
            let a = agent_dir.display();
            let m = master.dir.display();
            let mut config = format!(
                "node = \"{id}\"\n\
                 pki_dir = \"{m}/pki\"\n\
                 state_dir = \"{a}/state\"\n\
                 listen = \"{listen}\"\n\
                 \n[tls]\nca = \"{a}/ca.pem\"\ncert = \"{a}/node.pem\"\nkey = \"{a}/node.key\"\n\
                 \n[salt]\nmaster_config = \"{m}/master\"\ncachedir = \"{m}/cache\"\nmaster_id = \"{id}\"\n\
                 version_command = [\"{salt_master}\", \"--version\"]\n\
                 \n[timings]\nanti_entropy_interval = \"2s\"\nreconnect_max = \"500ms\"\n",
                id = master.id,
                listen = addrs[i],
                salt_master = super::tool(&master.version, "salt-master").display(),
            );
            for (j, peer) in masters.iter().enumerate().filter(|(j, _)| *j != i) {
                config.push_str(&format!("\n[[peer]]\nname = \"{}\"\naddress = \"{}\"\n", peer.id, addrs[j]));
            }
            let path = agent_dir.join("config.toml");
            write_file(&path, config.as_bytes(), 0o600);
            path
        })
        .collect()
}

/// `n` minion public keys made with Salt's own generator, cached in the build
/// folder like the venvs (`<target>/salt-e2e-keys/bulk-<n>/`): 200 RSA keys
/// cost about 35 s of CPU, so both Salt versions and later runs share them.
/// Only the `.pub` files are kept. One generation at a time in this process.
fn cached_bulk_keys(version: &str, n: usize) -> (PathBuf, Vec<String>) {
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let target =
        super::venv(version).parent().and_then(Path::parent).expect("venvs live in <target>/salt-venvs").to_path_buf();
    let dir = target.join("salt-e2e-keys").join(format!("bulk-{n}"));
    let width = (n - 1).to_string().len();
    let ids: Vec<String> = (0..n).map(|k| format!("bulk-{k:0width$}")).collect();
    let complete = dir.join(".complete");
    if !complete.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        let out = dir.with_extension("out");
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        let mut making = gen_keys(version, &dir, "bulk-", n, out.clone());
        let status = making.wait(Duration::from_secs(600));
        assert!(status.is_some_and(|s| s.success()), "tests/salt/gen-keys.py failed: {}", read(&out));
        for id in &ids {
            std::fs::remove_file(dir.join(format!("{id}.pem"))).unwrap();
            assert!(dir.join(format!("{id}.pub")).exists(), "gen-keys.py made no {id}.pub");
        }
        write_file(&complete, b"", 0o600);
    }
    (dir, ids)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
