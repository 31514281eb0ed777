//! The master settings that decide which minion keys get in without an
//! operator, read as Salt reads them: `auto_accept`, `open_mode`,
//! `autosign_file`, `autosign_grains_dir` (accept), `autoreject_file`
//! (refuse), and the key store's `key_cache` and `keys.cache_driver`.
//!
//! With salt-keysync a key one master accepts is accepted on every master,
//! so a master that accepts by itself does it for all of them. Booleans and
//! names are kept as values; signing files only as how many patterns they
//! hold and a sha256 of their content, because the content (minion ids,
//! grain values that get in) is the secret an attacker would want.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use yaml_rust2::Yaml;

/// Every setting here, by the name Salt's config uses.
pub const ACCEPT_SETTINGS: [&str; 7] = [
    "auto_accept",
    "open_mode",
    "autosign_file",
    "autosign_grains_dir",
    "autoreject_file",
    "key_cache",
    "keys.cache_driver",
];

/// The settings through which a master can accept keys by itself.
pub const AUTO_ACCEPT_SETTINGS: [&str; 4] = ["auto_accept", "open_mode", "autosign_file", "autosign_grains_dir"];

/// Largest signing file (or grains file) read; Salt's are a few lines.
const MAX_SIGNING_BYTES: u64 = 1024 * 1024;
/// Most files, and bytes in all, read from an `autosign_grains_dir`.
const MAX_GRAIN_FILES: usize = 1024;
const MAX_GRAIN_BYTES: u64 = 4 * 1024 * 1024;

/// What a master's config says about accepting keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptSettings {
    pub auto_accept: bool,
    pub open_mode: bool,
    pub autosign_file: SigningSource,
    pub autosign_grains_dir: SigningSource,
    pub autoreject_file: SigningSource,
    /// `""` (Salt's default) or `sched`.
    pub key_cache: String,
    /// `localfs_key` unless set.
    pub keys_cache_driver: String,
}

/// A signing file or folder, as far as it may leave the master.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum SigningSource {
    /// Not configured.
    Unset,
    /// Configured, but nothing is at that path.
    Absent,
    /// There. `entries`: the patterns (or grain values) Salt would match,
    /// 0 for a file Salt ignores for its permissions; `sha256`: hex of the
    /// content. Both `None` when it was not read (a symlink, too large).
    Present { entries: Option<u32>, sha256: Option<String> },
}

impl SigningSource {
    /// Whether Salt would match anything with it. One not read counts:
    /// Salt would read it.
    pub fn matches_any(&self) -> bool {
        matches!(self, SigningSource::Present { entries, .. } if entries.is_none_or(|n| n > 0))
    }

    /// A value to compare between masters: equal content is equal, wherever it lives.
    fn fingerprint(&self) -> String {
        match self {
            SigningSource::Unset => "unset".into(),
            SigningSource::Absent => "absent".into(),
            SigningSource::Present { sha256: Some(hash), .. } => hash.clone(),
            SigningSource::Present { sha256: None, .. } => "unread".into(),
        }
    }

    /// How it accepts, for a person: `autosign_file (2 patterns)`.
    fn describe(&self, name: &str) -> String {
        match self {
            SigningSource::Present { entries: Some(n), .. } => format!("{name} ({n} patterns)"),
            _ => format!("{name} (not read; Salt would read it)"),
        }
    }
}

impl AcceptSettings {
    /// Salt's defaults: nothing is accepted by itself.
    pub fn salt_defaults() -> AcceptSettings {
        AcceptSettings {
            auto_accept: false,
            open_mode: false,
            autosign_file: SigningSource::Unset,
            autosign_grains_dir: SigningSource::Unset,
            autoreject_file: SigningSource::Unset,
            key_cache: String::new(),
            keys_cache_driver: "localfs_key".into(),
        }
    }

    /// The settings (of [`AUTO_ACCEPT_SETTINGS`]) through which this master
    /// accepts keys by itself, each with how.
    pub fn auto_accepting(&self) -> Vec<(&'static str, String)> {
        let mut how = Vec::new();
        if self.auto_accept {
            how.push(("auto_accept", "auto_accept: True".to_string()));
        }
        if self.open_mode {
            how.push(("open_mode", "open_mode: True".to_string()));
        }
        if self.autosign_file.matches_any() {
            how.push(("autosign_file", self.autosign_file.describe("autosign_file")));
        }
        if self.autosign_grains_dir.matches_any() {
            how.push(("autosign_grains_dir", self.autosign_grains_dir.describe("autosign_grains_dir")));
        }
        how
    }

    /// Setting name (of [`ACCEPT_SETTINGS`]) → a value to compare between masters.
    pub fn fingerprints(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("auto_accept", self.auto_accept.to_string()),
            ("open_mode", self.open_mode.to_string()),
            ("autosign_file", self.autosign_file.fingerprint()),
            ("autosign_grains_dir", self.autosign_grains_dir.fingerprint()),
            ("autoreject_file", self.autoreject_file.fingerprint()),
            ("key_cache", self.key_cache.clone()),
            ("keys.cache_driver", self.keys_cache_driver.clone()),
        ])
    }
}

/// Reads the settings from the merged master config (`master` plus
/// `master.d/*.conf`). Problems reading a signing file are returned beside
/// the settings; the file then counts as not read.
pub fn accept_settings(config: &Yaml) -> (AcceptSettings, Vec<String>) {
    let mut errors = Vec::new();
    let root_dir = config["root_dir"].as_str().unwrap_or("/");
    let permissive = salt_true(&config["permissive_pki_access"]);
    let mut source = |key: &str, read: fn(&Path, bool) -> Result<SigningSource, String>| match config[key].as_str() {
        None | Some("") => SigningSource::Unset,
        Some(path) => {
            let path = salt_path(root_dir, path);
            read(&path, permissive).unwrap_or_else(|e| {
                errors.push(format!("{key} {}: {e}", path.display()));
                SigningSource::Present { entries: None, sha256: None }
            })
        }
    };
    let settings = AcceptSettings {
        auto_accept: salt_true(&config["auto_accept"]),
        open_mode: salt_true(&config["open_mode"]),
        autosign_file: source("autosign_file", read_signing_file),
        autosign_grains_dir: source("autosign_grains_dir", read_grains_dir),
        autoreject_file: source("autoreject_file", read_signing_file),
        key_cache: config["key_cache"].as_str().unwrap_or_default().to_string(),
        keys_cache_driver: config["keys.cache_driver"].as_str().unwrap_or("localfs_key").to_string(),
    };
    (settings, errors)
}

/// Salt honours these two settings only when they are exactly `True`, and
/// reads YAML 1.1, where `yes` and `on` are `True` too. A quoted "yes" is a
/// string to Salt, but the YAML parser here no longer tells it from a plain
/// one: counting it as true errs on the side of a warning.
fn salt_true(value: &Yaml) -> bool {
    match value {
        Yaml::Boolean(b) => *b,
        Yaml::String(s) => matches!(s.as_str(), "yes" | "Yes" | "YES" | "on" | "On" | "ON"),
        _ => false,
    }
}

/// Where Salt looks for a path setting: `root_dir` is put in front of it
/// unless it is already inside `root_dir` (Salt's `prepend_root_dir`).
fn salt_path(root_dir: &str, path: &str) -> PathBuf {
    let root = root_dir.trim_end_matches('/');
    if root.is_empty() || path == root || path.starts_with(&format!("{root}/")) {
        return Path::new("/").join(path);
    }
    Path::new(root).join(path.trim_start_matches('/'))
}

/// Whether Salt reads a signing file with this mode (`AutoKey.check_permissions`):
/// not when others may write it, nor its group without `permissive_pki_access`.
fn salt_trusts(mode: u32, permissive: bool) -> bool {
    mode & 0o002 == 0 && (mode & 0o020 == 0 || permissive)
}

/// Opens a regular file without following a symlink (the config may point
/// into folders the salt user owns) and reads at most [`MAX_SIGNING_BYTES`].
/// `Ok(None)`: a symlink or too large, not read.
fn read_regular(path: &Path) -> Result<Option<(u32, Vec<u8>)>, String> {
    let file = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)
    {
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
        other => other.map_err(|e| e.to_string())?,
    };
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_SIGNING_BYTES + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_SIGNING_BYTES {
        return Ok(None);
    }
    Ok(Some((meta.mode(), bytes)))
}

/// Lines Salt matches: stripped, not blank, not a `#` comment.
fn count_patterns(bytes: &[u8]) -> u32 {
    String::from_utf8_lossy(bytes).lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).count()
        as u32
}

fn read_signing_file(path: &Path, permissive: bool) -> Result<SigningSource, String> {
    if std::fs::symlink_metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Ok(SigningSource::Absent);
    }
    Ok(match read_regular(path)? {
        None => SigningSource::Present { entries: None, sha256: None },
        Some((mode, bytes)) => SigningSource::Present {
            entries: Some(if salt_trusts(mode, permissive) { count_patterns(&bytes) } else { 0 }),
            sha256: Some(hex::encode(Sha256::digest(&bytes))),
        },
    })
}

/// An `autosign_grains_dir`: one file per grain, one accepted value per
/// line. Only files directly inside are read (Salt looks them up there);
/// the fingerprint covers their names and contents.
fn read_grains_dir(path: &Path, permissive: bool) -> Result<SigningSource, String> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SigningSource::Absent),
        other => other.map_err(|e| e.to_string())?,
    };
    if meta.file_type().is_symlink() {
        return Ok(SigningSource::Present { entries: None, sha256: None });
    }
    if !meta.is_dir() {
        // Salt walks it and finds nothing.
        return Ok(SigningSource::Present { entries: Some(0), sha256: Some(hex::encode(Sha256::digest(b""))) });
    }
    let mut names: Vec<_> = std::fs::read_dir(path)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .map(|e| e.file_name())
        .collect();
    if names.len() > MAX_GRAIN_FILES {
        return Ok(SigningSource::Present { entries: None, sha256: None });
    }
    names.sort();
    let (mut entries, mut hash, mut total) = (0u32, Sha256::new(), 0u64);
    for name in names {
        let Some((mode, bytes)) = read_regular(&path.join(&name))? else {
            return Ok(SigningSource::Present { entries: None, sha256: None });
        };
        total += bytes.len() as u64;
        if total > MAX_GRAIN_BYTES {
            return Ok(SigningSource::Present { entries: None, sha256: None });
        }
        if salt_trusts(mode, permissive) {
            entries += count_patterns(&bytes);
        }
        hash.update(name.as_encoded_bytes());
        hash.update([0]);
        hash.update(&bytes);
        hash.update([0]);
    }
    Ok(SigningSource::Present { entries: Some(entries), sha256: Some(hex::encode(hash.finalize())) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use yaml_rust2::YamlLoader;

    fn parse(text: &str) -> Yaml {
        YamlLoader::load_from_str(text).unwrap().remove(0)
    }

    fn write(path: &Path, text: &str, mode: u32) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn booleans_are_read_as_salt_reads_yaml() {
        for (text, want) in
            [("True", true), ("true", true), ("yes", true), ("on", true), ("False", false), ("1", false), ("no", false)]
        {
            let (settings, _) = accept_settings(&parse(&format!("auto_accept: {text}\nopen_mode: {text}\n")));
            assert_eq!((settings.auto_accept, settings.open_mode), (want, want), "{text}");
        }
        let (settings, errors) = accept_settings(&parse("interface: 1.2.3.4\n"));
        assert_eq!(settings, AcceptSettings::salt_defaults());
        assert!(errors.is_empty() && settings.auto_accepting().is_empty());
    }

    #[test]
    fn paths_get_root_dir_in_front_as_salt_does() {
        assert_eq!(salt_path("/", "/etc/salt/autosign.conf"), Path::new("/etc/salt/autosign.conf"));
        assert_eq!(salt_path("/", "autosign.conf"), Path::new("/autosign.conf"));
        assert_eq!(salt_path("/srv/m1", "/etc/salt/autosign.conf"), Path::new("/srv/m1/etc/salt/autosign.conf"));
        assert_eq!(salt_path("/srv/m1/", "/srv/m1/autosign.conf"), Path::new("/srv/m1/autosign.conf"));
        assert_eq!(salt_path("/srv/m1", "grains"), Path::new("/srv/m1/grains"));
    }

    #[test]
    fn signing_files_count_patterns_salt_would_use_and_leave_only_a_hash() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let config = |extra: &str| {
            parse(&format!("root_dir: {root}\nautosign_file: /autosign.conf\nautoreject_file: reject.conf\nautosign_grains_dir: grains\n{extra}"))
        };
        let (settings, errors) = accept_settings(&config(""));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(settings.autosign_file, SigningSource::Absent);
        assert!(settings.auto_accepting().is_empty());

        write(&dir.path().join("autosign.conf"), "# nobody yet\n\n", 0o600);
        let (settings, _) = accept_settings(&config(""));
        assert!(matches!(settings.autosign_file, SigningSource::Present { entries: Some(0), .. }));
        assert!(settings.auto_accepting().is_empty(), "comments accept nothing");

        write(&dir.path().join("autosign.conf"), "# web servers\nweb*\n  db01  \n", 0o644);
        write(&dir.path().join("grains/uuid"), "8f7d\n", 0o600);
        let (settings, _) = accept_settings(&config(""));
        assert!(matches!(settings.autosign_file, SigningSource::Present { entries: Some(2), .. }));
        assert!(matches!(settings.autosign_grains_dir, SigningSource::Present { entries: Some(1), .. }));
        let how: Vec<_> = settings.auto_accepting().into_iter().map(|(s, _)| s).collect();
        assert_eq!(how, ["autosign_file", "autosign_grains_dir"]);
        let text = serde_json::to_string(&settings).unwrap();
        assert!(!text.contains("web*") && !text.contains("8f7d"), "content never leaves: {text}");

        // Salt ignores a signing file others (or, by default, its group) may write.
        std::fs::set_permissions(dir.path().join("autosign.conf"), std::fs::Permissions::from_mode(0o664)).unwrap();
        let (settings, _) = accept_settings(&config(""));
        assert!(matches!(settings.autosign_file, SigningSource::Present { entries: Some(0), .. }));
        let (settings, _) = accept_settings(&config("permissive_pki_access: True\n"));
        assert!(matches!(settings.autosign_file, SigningSource::Present { entries: Some(2), .. }));
    }

    #[test]
    fn a_symlink_is_not_read_and_counts_as_accepting() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("secret"), "*\n", 0o600);
        std::os::unix::fs::symlink(dir.path().join("secret"), dir.path().join("autosign.conf")).unwrap();
        let config = parse(&format!("autosign_file: {}/autosign.conf\n", dir.path().display()));
        let (settings, _) = accept_settings(&config);
        assert_eq!(settings.autosign_file, SigningSource::Present { entries: None, sha256: None });
        assert_eq!(settings.auto_accepting()[0].1, "autosign_file (not read; Salt would read it)");
    }

    #[test]
    fn equal_content_is_no_drift_wherever_it_lives() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        write(&a.path().join("x/reject.conf"), "bad*\n", 0o600);
        write(&b.path().join("reject.conf"), "bad*\n", 0o600);
        let read = |path: PathBuf| accept_settings(&parse(&format!("autoreject_file: {}\n", path.display()))).0;
        let (fa, fb) = (read(a.path().join("x/reject.conf")), read(b.path().join("reject.conf")));
        assert_eq!(fa.fingerprints(), fb.fingerprints());
        write(&b.path().join("reject.conf"), "bad*\nworse*\n", 0o600);
        assert_ne!(
            fa.fingerprints()["autoreject_file"],
            read(b.path().join("reject.conf")).fingerprints()["autoreject_file"]
        );
    }
}
