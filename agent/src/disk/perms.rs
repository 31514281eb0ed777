//! Start-up permission checks, in the manner of ssh's `StrictModes`: the agent
//! refuses to start when a file or folder that decides whom it trusts, or
//! what it writes into the master's key folders, is open to other users.
//!
//! Why each rule exists:
//! - the TLS key is the node's identity: anyone who reads it can pose as this
//!   master to every peer (so: owner only, as ssh demands of private keys);
//! - the config names the peers and the CA: whoever can write it chooses whom
//!   the agent trusts; whoever can read it learns the topology;
//! - the CA and certificate are public, but whoever can replace the CA
//!   certificate chooses whom the agent trusts;
//! - the state folder holds the decisions store and usually the audit log;
//! - pki_dir and its three key folders: whoever can write there can make the
//!   agent replicate an accept to every master (their owners, and symlinks,
//!   are checked on their descriptors when they are opened: `pki/dirs.rs`);
//! - the folders holding the TLS files, the config and the audit log: whoever
//!   can write there can swap the file for another.
//!
//! Owners too, not only modes: each of these must belong to root or to the
//! user the agent runs as (a file another user owns can be chmod-ed open by
//! that user at any time).

use std::fmt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::core::Folder;

/// One kind of path and the permission bits it must not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A private key: no access at all for group or others.
    PrivateKey,
    /// The config file: not readable by others, not writable by group or others.
    ConfigFile,
    /// A public file the trust depends on (CA, certificate): not writable by group or others.
    TrustFile,
    /// The state folder: no access for others, not writable by group.
    StateDir,
    /// pki_dir and its key folders: not writable by group or others.
    KeyFolder,
    /// A folder holding one of the files above: not writable by group or others.
    TrustFolder,
}

impl Rule {
    /// The permission bits this kind of path must not have.
    pub fn forbidden(self) -> u32 {
        match self {
            Rule::PrivateKey => 0o077,
            Rule::ConfigFile | Rule::StateDir => 0o027,
            Rule::TrustFile | Rule::KeyFolder | Rule::TrustFolder => 0o022,
        }
    }

    fn requirement(self) -> &'static str {
        match self {
            Rule::PrivateKey => "it must not be accessible by group or others",
            Rule::ConfigFile => "it must not be readable by others nor writable by group or others",
            Rule::TrustFile => "it must not be writable by group or others",
            Rule::StateDir => "it must not be accessible by others nor writable by group",
            Rule::KeyFolder => "it must not be writable by group or others",
            Rule::TrustFolder => "it holds a file the agent trusts: it must not be writable by group or others",
        }
    }

    /// Whether the owner matters here (pki_dir's owner is the salt user's:
    /// checked where the folders are opened).
    fn checks_owner(self) -> bool {
        self != Rule::KeyFolder
    }
}

/// A path whose permissions are too open, or that cannot be examined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermError {
    TooOpen { path: PathBuf, mode: u32, rule: Rule },
    Owner { path: PathBuf, uid: u32, agent_uid: u32 },
    Stat { path: PathBuf, error: String },
}

impl fmt::Display for PermError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PermError::TooOpen { path, mode, rule } => write!(
                f,
                "permissions {mode:04o} for '{}' are too open: {} (chmod {:o})",
                path.display(),
                rule.requirement(),
                mode & !rule.forbidden()
            ),
            PermError::Owner { path, uid, agent_uid } => write!(
                f,
                "'{}' is owned by uid {uid}, not root nor the agent's user (uid {agent_uid}): another user could \
                 change it at any time (chown it to root or to uid {agent_uid})",
                path.display()
            ),
            PermError::Stat { path, error } => {
                write!(f, "cannot examine the permissions of '{}': {error}", path.display())
            }
        }
    }
}

impl std::error::Error for PermError {}

/// Checks one path (following symlinks: the file actually read is what
/// matters). A missing path is not this check's concern: whoever opens it
/// reports that with its own context.
pub fn check_path(path: &Path, rule: Rule) -> Result<(), PermError> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(PermError::Stat { path: path.into(), error: e.to_string() }),
    };
    let mode = meta.permissions().mode() & 0o7777;
    if mode & rule.forbidden() != 0 {
        return Err(PermError::TooOpen { path: path.into(), mode, rule });
    }
    let agent_uid = rustix::process::geteuid().as_raw();
    let uid = std::os::unix::fs::MetadataExt::uid(&meta);
    if rule.checks_owner() && uid != 0 && uid != agent_uid {
        return Err(PermError::Owner { path: path.into(), uid, agent_uid });
    }
    Ok(())
}

/// The config file itself (its path is not part of [`Config`]) and its folder.
pub fn check_config_file(path: &Path) -> Result<(), PermError> {
    check_path(path, Rule::ConfigFile)?;
    check_path(parent_of(path), Rule::TrustFolder)
}

/// The folder a file is in (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Every path of `config` that the rules cover, in the order a reader would
/// fix them; all problems, not just the first.
pub fn check_config_paths(config: &Config) -> Vec<PermError> {
    covered_paths(config).into_iter().filter_map(|(path, rule)| check_path(&path, rule).err()).collect()
}

/// The paths [`check_config_paths`] could not check because they do not
/// exist (`check` must not call them ok). `state_dir` is not among them:
/// `run` makes it, private, at its first start.
pub fn missing_paths(config: &Config) -> Vec<PathBuf> {
    covered_paths(config)
        .into_iter()
        .map(|(path, _)| path)
        .filter(|path| *path != config.state_dir)
        .filter(|path| std::fs::metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound))
        .collect()
}

fn covered_paths(config: &Config) -> Vec<(PathBuf, Rule)> {
    let mut paths = vec![
        (config.tls.key.clone(), Rule::PrivateKey),
        (config.tls.cert.clone(), Rule::TrustFile),
        (config.tls.ca.clone(), Rule::TrustFile),
        (config.state_dir.clone(), Rule::StateDir),
        (config.pki_dir.clone(), Rule::KeyFolder),
    ];
    paths.extend(Folder::ALL.map(|folder| (config.pki_dir.join(folder.dir_name()), Rule::KeyFolder)));
    // The folders holding the files the agent trusts, and the audit log's.
    for file in [&config.tls.key, &config.tls.cert, &config.tls.ca, &config.audit_log] {
        let folder = (parent_of(file).to_path_buf(), Rule::TrustFolder);
        if !paths.contains(&folder) {
            paths.push(folder);
        }
    }
    // (The agent's own folder in pki_dir is checked, and replaced when it is
    // not its own, where it is opened: `pki/staging.rs`.)
    paths
}

/// Start-up: creates a missing state folder with mode 0700 (so the default
/// umask cannot make it too open), then refuses to go on if any path is
/// too open, naming every one of them.
pub fn enforce(config: &Config) -> anyhow::Result<()> {
    if !config.state_dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&config.state_dir)
            .map_err(|e| anyhow::anyhow!("cannot create state_dir {}: {e}", config.state_dir.display()))?;
    }
    let problems = check_config_paths(config);
    match problems.as_slice() {
        [] => Ok(()),
        [one] => anyhow::bail!("{one}"),
        many => {
            let list: Vec<String> = many.iter().map(ToString::to_string).collect();
            anyhow::bail!("{} paths have unsafe permissions:\n  {}", many.len(), list.join("\n  "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn with_mode(dir: &Path, name: &str, mode: u32, is_dir: bool) -> PathBuf {
        let path = dir.join(name);
        if is_dir {
            fs::create_dir(&path).unwrap();
        } else {
            fs::write(&path, "x").unwrap();
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn names_the_path_the_mode_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let key = with_mode(dir.path(), "node.key", 0o644, false);
        let err = check_path(&key, Rule::PrivateKey).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "permissions 0644 for '{}' are too open: it must not be accessible by group or others (chmod 600)",
                key.display()
            )
        );
    }

    #[test]
    fn each_rule_refuses_what_it_should_and_only_that() {
        let dir = tempfile::tempdir().unwrap();
        // (rule, is a folder, modes refused, modes allowed)
        let cases: [(Rule, bool, &[u32], &[u32]); 6] = [
            (Rule::PrivateKey, false, &[0o644, 0o640, 0o604, 0o660, 0o601], &[0o600, 0o400]),
            (Rule::ConfigFile, false, &[0o644, 0o604, 0o620, 0o602, 0o666], &[0o600, 0o640, 0o400]),
            (Rule::TrustFile, false, &[0o664, 0o646, 0o666], &[0o644, 0o600, 0o444]),
            (Rule::StateDir, true, &[0o755, 0o705, 0o770, 0o701], &[0o700, 0o750]),
            (Rule::KeyFolder, true, &[0o777, 0o775, 0o757, 0o1777], &[0o700, 0o755, 0o750]),
            (Rule::TrustFolder, true, &[0o777, 0o775, 0o757], &[0o700, 0o755, 0o750]),
        ];
        let mut n = 0;
        for (rule, is_dir, refused, allowed) in cases {
            for (modes, want_ok) in [(refused, false), (allowed, true)] {
                for &mode in modes {
                    n += 1;
                    let path = with_mode(dir.path(), &format!("p{n}"), mode, is_dir);
                    let result = check_path(&path, rule);
                    assert_eq!(result.is_ok(), want_ok, "{rule:?} {mode:04o}: {result:?}");
                    if let Err(e) = result {
                        assert!(e.to_string().contains(&format!("permissions {mode:04o} for ")), "{e}");
                    }
                }
            }
        }
        assert!(check_path(&dir.path().join("missing"), Rule::PrivateKey).is_ok());
    }

    /// Issue 14 item 3 (ssh StrictModes): a key another user owns is refused
    /// even with mode 0600 (that user can open it again at any time); the
    /// salt user may own pki_dir, never the agent's own files.
    #[test]
    fn another_users_file_is_refused_whatever_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let key = with_mode(dir.path(), "node.key", 0o600, false);
        rustix::fs::chown(&key, Some(rustix::fs::Uid::from_raw(4242)), None).unwrap();
        let err = check_path(&key, Rule::PrivateKey).unwrap_err();
        assert!(matches!(err, PermError::Owner { uid: 4242, .. }), "{err}");
        assert!(err.to_string().contains("owned by uid 4242"), "{err}");
        let folder = with_mode(dir.path(), "tls", 0o755, true);
        rustix::fs::chown(&folder, Some(rustix::fs::Uid::from_raw(4242)), None).unwrap();
        assert!(matches!(check_path(&folder, Rule::TrustFolder), Err(PermError::Owner { .. })));
        let pki = with_mode(dir.path(), "pki", 0o755, true);
        rustix::fs::chown(&pki, Some(rustix::fs::Uid::from_raw(4242)), None).unwrap();
        assert!(check_path(&pki, Rule::KeyFolder).is_ok(), "the salt user's pki_dir");
    }
}
