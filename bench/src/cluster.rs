//! Three real agent processes for the benchmark, on loopback with mTLS, with
//! the harness's files made private (0600 files, 0700 folders) and the
//! production timings (the test harness shortens them); each, if asked, in
//! a mount namespace of its own where its folders are mounted as the
//! packaged systemd unit mounts them.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use keysync_tests::binary::{AgentProcess, ProcessCluster};
use keysync_tests::cluster::AgentFiles;

use crate::Settings;

/// How an agent's folders are mounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// As they are: no mount of their own.
    Plain,
    /// As packaging/salt-keysync.service makes them: pki_dir one bind mount
    /// (ReadWritePaths=), state_dir another. (The unit of earlier releases
    /// made each key folder a mount of its own; the agent now refuses that
    /// layout at start, as `tests/faults/bind_mounts.rs` checks, so there is
    /// nothing left to measure there.)
    Unit,
}

impl Layout {
    /// The command each agent is started under: `unshare` into a private
    /// mount namespace, the bind mounts, then the agent. None for `Plain`.
    fn wrapper(self, files: &AgentFiles) -> Vec<OsString> {
        let mounts: Vec<PathBuf> = match self {
            Layout::Plain => return Vec::new(),
            Layout::Unit => vec![files.pki.clone(), files.dir.join("state")],
        };
        // `sh -c SCRIPT sh DIR... -- AGENT ARGS`: each DIR bound onto itself.
        let script = r#"while [ "$1" != -- ]; do mount --bind "$1" "$1" || exit 1; shift; done; shift; exec "$@""#;
        let mut wrapper: Vec<OsString> =
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"].map(OsString::from).into();
        wrapper.extend(mounts.into_iter().map(PathBuf::into_os_string));
        wrapper.push("--".into());
        wrapper
    }
}

/// Three agents' files (or any number, see [`BenchCluster::from_files`]);
/// each agent started when the benchmark says so.
pub struct BenchCluster {
    pub files: Vec<AgentFiles>,
    agents: Vec<Option<AgentProcess>>,
    log_filter: String,
    layout: Layout,
    /// Per agent, the command it is started under instead of the layout's
    /// (the WAN benchmark's `ip netns exec NAME`); empty: the layout's.
    wrappers: Vec<Vec<OsString>>,
    _root: Option<tempfile::TempDir>,
}

impl BenchCluster {
    /// Writes three agents' files under a fresh folder (or `settings.keep`/`name`).
    pub fn new(settings: &Settings, name: &str) -> anyhow::Result<BenchCluster> {
        let (root, path) = bench_folder(settings.keep.as_deref(), name, "keysync-bench-")?;
        let files = ProcessCluster::write_files(&path, 3);
        for f in &files {
            use_default_timings(&f.config_path, settings.guard)?;
            // Mount points must exist (the old unit made the staging folder in ExecStartPre).
            for dir in [f.dir.join("state"), f.pki.join(".keysync-staging")] {
                std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            }
            make_private(&f.dir)?;
        }
        if settings.layout != Layout::Plain && !rustix::process::geteuid().is_root() {
            bail!(
                "--layout {:?} bind-mounts the agents' folders in mount namespaces of their own: run it as root",
                settings.layout
            );
        }
        Ok(BenchCluster::from_files(files, &settings.log_filter, settings.layout, root))
    }

    /// A cluster of agents whose files the caller wrote (under `root`, kept
    /// as long as the cluster if given).
    pub fn from_files(
        files: Vec<AgentFiles>,
        log_filter: &str,
        layout: Layout,
        root: Option<tempfile::TempDir>,
    ) -> BenchCluster {
        BenchCluster {
            agents: files.iter().map(|_| None).collect(),
            wrappers: vec![Vec::new(); files.len()],
            files,
            log_filter: log_filter.to_string(),
            layout,
            _root: root,
        }
    }

    /// Starts agent `idx` as `wrapper... <agent> run --config ...` from now on.
    pub fn wrap(&mut self, idx: usize, wrapper: Vec<OsString>) {
        self.wrappers[idx] = wrapper;
    }

    pub fn pki(&self, idx: usize) -> &Path {
        &self.files[idx].pki
    }

    /// Starts agent `idx` and waits until it logged its start (after its
    /// start-up reconciliation).
    pub fn start(&mut self, idx: usize) -> anyhow::Result<()> {
        self.spawn(idx);
        self.wait_started(idx)
    }

    pub fn start_all(&mut self) -> anyhow::Result<()> {
        (0..self.files.len()).try_for_each(|idx| self.start(idx))
    }

    /// Starts agent `idx`'s process and returns at once.
    pub fn spawn(&mut self, idx: usize) {
        let f = &self.files[idx];
        let wrapper = match &self.wrappers[idx] {
            wrapper if !wrapper.is_empty() => wrapper.clone(),
            _ => self.layout.wrapper(f),
        };
        let agent = AgentProcess::start_wrapped(&f.config_path, f.dir.join("agent.log"), &self.log_filter, &wrapper);
        self.agents[idx] = Some(agent);
    }

    /// Waits until agent `idx` logged its start.
    fn wait_started(&self, idx: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.has_started(idx)? {
            if Instant::now() > deadline {
                bail!("{} did not start within 120 s; see {}", self.files[idx].name, self.log(idx).display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Whether agent `idx` logged its start (after its start-up
    /// reconciliation); an error once it logged an error instead.
    pub fn has_started(&self, idx: usize) -> anyhow::Result<bool> {
        let text = std::fs::read_to_string(self.log(idx)).unwrap_or_default();
        if text.contains("agent started") {
            return Ok(true);
        }
        if text.contains("Error") {
            bail!("{} did not start: {}", self.files[idx].name, text);
        }
        Ok(false)
    }

    pub fn pid(&self, idx: usize) -> Option<u32> {
        self.agents[idx].as_ref().map(AgentProcess::pid)
    }

    pub fn log(&self, idx: usize) -> PathBuf {
        self.files[idx].dir.join("agent.log")
    }

    /// Sessions of agent `idx`'s links that failed on a timeout, as its log
    /// says ("sync failed" with a handshake not completed in time, a connect
    /// or keep-alive timed out, a peer's answer or push stream timed out). A
    /// refused connection (the peer not listening yet) is not one.
    pub fn link_timeouts(&self, idx: usize) -> usize {
        let text = std::fs::read_to_string(self.log(idx)).unwrap_or_default();
        text.lines().filter(|line| line.contains("sync failed") && is_timeout(line)).count()
    }

    /// Stops every agent with SIGTERM; an unclean exit is an error.
    pub fn stop(mut self) -> anyhow::Result<()> {
        for (idx, agent) in self.agents.iter_mut().enumerate() {
            if let Some(agent) = agent.take() {
                let status = agent.stop();
                if !status.success() {
                    bail!("{} exited with {status}; see {}", self.files[idx].name, self.log(idx).display());
                }
            }
        }
        Ok(())
    }
}

/// The folder of one part of the benchmark: `keep/name` if the folders are
/// kept, else a fresh temporary folder (`prefix...`) deleted with the guard.
pub(crate) fn bench_folder(
    keep: Option<&Path>,
    name: &str,
    prefix: &str,
) -> anyhow::Result<(Option<tempfile::TempDir>, PathBuf)> {
    Ok(match keep {
        Some(keep) => {
            let path = keep.join(name);
            std::fs::create_dir_all(&path).with_context(|| format!("cannot create {}", path.display()))?;
            (None, path)
        }
        None => {
            let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
            let path = dir.path().to_path_buf();
            (Some(dir), path)
        }
    })
}

/// Drops the harness's short test timings, so the agents run with the
/// defaults an operator gets (anti-entropy every 60 s, rescan every 300 s).
pub(crate) fn use_default_timings(config: &Path, guard: bool) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config)?;
    let kept: Vec<&str> = text
        .lines()
        .filter(|line| {
            !["anti_entropy_interval", "reconnect_max", "rescan_interval"].iter().any(|k| line.starts_with(k))
        })
        .collect();
    let mut text = kept.join("\n") + "\n";
    if !guard {
        text.push_str("\n[guard]\nenabled = false\n");
    }
    std::fs::write(config, text)?;
    Ok(())
}

/// 0700 for every folder, 0600 for every file under `dir`.
pub(crate) fn make_private(dir: &Path) -> anyhow::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    let mode = if meta.is_dir() { 0o700 } else { 0o600 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", dir.display()))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            make_private(&entry?.path())?;
        }
    }
    Ok(())
}

/// Real public keys (P-256, as rcgen makes them) to hand out round-robin: the
/// agent checks every key's form, not that keys differ between minions.
pub fn key_pool(n: usize) -> Vec<String> {
    (0..n).map(|_| keysync_tests::salt_ops::new_public_key()).collect()
}

/// `n` different RSA 2048 public keys in the form Salt writes minion keys
/// (PEM `PUBLIC KEY`, 64-column lines, 451 bytes), for figures relative to
/// the key material, such as the bytes of a join. Each is a real key made
/// with `openssl genrsa 2048 | openssl rsa -pubout` (`data/`) whose modulus
/// is replaced by pseudo-random bytes, different for each: as a site's keys
/// do, they share nothing a compressor could find (a pool of a few keys
/// handed out again and again would compress to a fraction).
pub fn rsa_keys(n: usize) -> Vec<String> {
    let template = pem::parse(include_str!("../data/rsa2048-public-key.pem")).expect("the fixture is PEM");
    let der = template.contents();
    // SubjectPublicKeyInfo of RSA 2048: the modulus's 256 bytes follow its
    // INTEGER header (02 82 01 01 00) at offset 28.
    const MODULUS: std::ops::Range<usize> = 33..289;
    assert_eq!(&der[28..33], [0x02, 0x82, 0x01, 0x01, 0x00], "an RSA 2048 public key");
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    (0..n as u64)
        .map(|i| {
            let mut der = der.to_vec();
            let mut state = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d;
            for chunk in der[MODULUS].chunks_mut(8) {
                // splitmix64
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                chunk.copy_from_slice(&z.to_be_bytes()[..chunk.len()]);
            }
            der[MODULUS.start] |= 0x80;
            der[MODULUS.end - 1] |= 1;
            pem::encode_config(&pem::Pem::new("PUBLIC KEY", der), config)
        })
        .collect()
}

/// Writes a decided key file the way Salt leaves one (mode 0644).
pub fn write_key(path: &Path, key: &str) -> anyhow::Result<()> {
    std::fs::write(path, key).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// One decided key in this many is rejected, the rest accepted.
pub const REJECTED_EVERY: usize = 20;

/// Gives `pki` `n` decided keys named `{prefix}0000000`… as a master that
/// already had its keys holds them: one in [`REJECTED_EVERY`] rejected.
pub fn seed_decided(pki: &Path, prefix: &str, n: usize, keys: &[String]) -> anyhow::Result<()> {
    for i in 0..n {
        let folder = if i.is_multiple_of(REJECTED_EVERY) { "minions_rejected" } else { "minions" };
        write_key(&keysync_tests::salt_ops::path(pki, folder, &format!("{prefix}{i:07}")), &keys[i % keys.len()])?;
    }
    Ok(())
}

/// Names starting with `prefix` in `pki/folder`.
pub fn count_named(pki: &Path, folder: &str, prefix: &str) -> usize {
    std::fs::read_dir(pki.join(folder))
        .map(|dir| dir.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with(prefix)).count())
        .unwrap_or(0)
}

/// Whether a "sync failed" line of an agent's log is a timeout.
fn is_timeout(line: &str) -> bool {
    let line = line.to_ascii_lowercase();
    ["not completed within", "timed out", "timeout"].iter().any(|t| line.contains(t))
}

#[cfg(test)]
mod tests {
    /// As the agent logs them: a handshake not answered in time is one, and
    /// so is a peer's answer or push stream that timed out; a peer not
    /// listening yet is not.
    #[test]
    fn a_session_that_timed_out_is_told_from_a_refused_one() {
        let timed_out = "WARN peer{peer=master-b address=127.0.0.1:35801}: salt_keysync::net::peers: sync failed \
                         error=connecting to peer master-b at 127.0.0.1:35801: TCP and TLS handshake not completed \
                         within 10s retry_in=100ms";
        let refused = "WARN peer{peer=master-b address=127.0.0.1:35801}: salt_keysync::net::peers: sync failed \
                       error=connecting to peer master-b at 127.0.0.1:35801: Connection refused (os error 111) \
                       retry_in=200ms";
        let answer = "WARN peer{peer=master-b address=127.0.0.1:35801}: salt_keysync::net::peers: sync failed \
                      error=the peer's answer to Fetch timed out: nothing more for 60 s retry_in=60s";
        let push = "WARN peer{peer=master-b address=127.0.0.1:35801}: salt_keysync::net::peers: sync failed \
                    error=the peer's push stream timed out: no batch taken for 300 s retry_in=60s";
        assert!(super::is_timeout(timed_out));
        assert!(super::is_timeout(answer));
        assert!(super::is_timeout(push));
        assert!(!super::is_timeout(refused));
    }

    /// The keys are as many as asked, all different, each of the size and
    /// form of Salt's RSA 2048 minion keys, and the agent takes them.
    #[test]
    fn rsa_keys_are_different_keys_of_salts_form() {
        let keys = super::rsa_keys(500);
        assert_eq!(keys.len(), 500);
        assert_eq!(keys.iter().collect::<std::collections::HashSet<_>>().len(), 500, "all different");
        for key in &keys {
            assert_eq!(key.len(), 451, "{key}");
            assert!(key.starts_with("-----BEGIN PUBLIC KEY-----\n") && key.ends_with("-----END PUBLIC KEY-----\n"));
            salt_keysync::core::keyfile::check_public_key(key.as_bytes()).expect("a public key");
        }
    }
}
