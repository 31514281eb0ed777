//! Three real agent processes for the benchmark, on loopback with mTLS, with
//! the harness's files made private (0600 files, 0700 folders) and the
//! production timings (the test harness shortens them).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use keysync_tests::binary::{AgentProcess, ProcessCluster};
use keysync_tests::cluster::AgentFiles;

use crate::Settings;

/// Three agents' files; each agent started when the benchmark says so.
pub struct BenchCluster {
    pub files: Vec<AgentFiles>,
    agents: Vec<Option<AgentProcess>>,
    log_filter: String,
    _root: Option<tempfile::TempDir>,
}

impl BenchCluster {
    /// Writes three agents' files under a fresh folder (or `settings.keep`/`name`).
    pub fn new(settings: &Settings, name: &str) -> anyhow::Result<BenchCluster> {
        let (root, path) = match &settings.keep {
            Some(keep) => {
                let path = keep.join(name);
                std::fs::create_dir_all(&path).with_context(|| format!("cannot create {}", path.display()))?;
                (None, path)
            }
            None => {
                let dir = tempfile::Builder::new().prefix("keysync-bench-").tempdir()?;
                let path = dir.path().to_path_buf();
                (Some(dir), path)
            }
        };
        let files = ProcessCluster::write_files(&path, 3);
        for f in &files {
            use_default_timings(&f.config_path)?;
            make_private(&f.dir)?;
        }
        Ok(BenchCluster { files, agents: vec![None, None, None], log_filter: settings.log_filter.clone(), _root: root })
    }

    pub fn pki(&self, idx: usize) -> &Path {
        &self.files[idx].pki
    }

    /// Starts agent `idx` and waits until it logged its start (after its
    /// start-up reconciliation).
    pub fn start(&mut self, idx: usize) -> anyhow::Result<()> {
        let f = &self.files[idx];
        let agent = AgentProcess::start_logging(&f.config_path, f.dir.join("agent.log"), &self.log_filter);
        let log = agent.log.clone();
        self.agents[idx] = Some(agent);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("agent started") {
                return Ok(());
            }
            if Instant::now() > deadline || text.contains("Error") {
                bail!("{} did not start: {}", f.name, text);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn start_all(&mut self) -> anyhow::Result<()> {
        (0..self.files.len()).try_for_each(|idx| self.start(idx))
    }

    pub fn pid(&self, idx: usize) -> Option<u32> {
        self.agents[idx].as_ref().map(AgentProcess::pid)
    }

    pub fn log(&self, idx: usize) -> PathBuf {
        self.files[idx].dir.join("agent.log")
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

/// Drops the harness's short test timings, so the agents run with the
/// defaults an operator gets (anti-entropy every 60 s, rescan every 300 s).
fn use_default_timings(config: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config)?;
    let kept: Vec<&str> = text
        .lines()
        .filter(|line| {
            !["anti_entropy_interval", "reconnect_max", "rescan_interval"].iter().any(|k| line.starts_with(k))
        })
        .collect();
    std::fs::write(config, kept.join("\n") + "\n")?;
    Ok(())
}

/// 0700 for every folder, 0600 for every file under `dir`.
fn make_private(dir: &Path) -> anyhow::Result<()> {
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

/// Writes a decided key file the way Salt leaves one (mode 0644).
pub fn write_key(path: &Path, key: &str) -> anyhow::Result<()> {
    std::fs::write(path, key).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// Names (no dot files) in `pki/folder`.
pub fn count_keys(pki: &Path, folder: &str) -> usize {
    std::fs::read_dir(pki.join(folder))
        .map(|dir| dir.filter_map(Result::ok).filter(|e| !e.file_name().to_string_lossy().starts_with('.')).count())
        .unwrap_or(0)
}
