//! Cluster health beyond keys: the sha256 fingerprint of this master's
//! `master.pub`, fingerprints of the master settings that Salt's
//! multi-master tutorial says must agree on every master, the settings that
//! decide which keys get accepted (`disk::accept`), the salt-master version,
//! the key counts and the agent's own version. Peers exchange these in
//! `Hello`; [`compare`] says what differs.
//!
//! The most common multi-master failure is masters that do not share one
//! key pair: minions then log "The Salt Master server's public key did not
//! authenticate!". Only a fingerprint of the PUBLIC key ever leaves the
//! master; master.pem is never opened.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use yaml_rust2::{Yaml, YamlLoader};

use crate::core::keyfile::check_public_key;
use crate::core::Fingerprint;
use crate::disk::accept::{accept_settings, AcceptSettings, ACCEPT_SETTINGS};

/// The settings Salt's multi-master tutorial lists as "must be the same on
/// every master", compared by name.
pub const SETTINGS: [&str; 5] = ["external_auth", "publisher_acl", "peer", "peer_run", "nodegroups"];

/// Every setting compared between masters: [`SETTINGS`], then the
/// key-acceptance settings.
pub fn compared_settings() -> impl Iterator<Item = &'static str> {
    SETTINGS.into_iter().chain(ACCEPT_SETTINGS)
}

/// The fingerprint of a setting that is not set at all (Salt's default).
pub const UNSET: &str = "unset";

/// Largest master config or `master.d` file read (Salt configs are small).
const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

/// What this master (or a peer) reports about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterHealth {
    /// sha256 of `pki_dir/master.pub`'s bytes, colon-hex like `salt-key -F`;
    /// `None` when it could not be read.
    pub master_pub: Option<String>,
    /// Setting name → sha256 (hex) of its canonical value, or [`UNSET`].
    /// Empty when the master config could not be read.
    pub settings: BTreeMap<String, String>,
    /// The salt-master version; `None` while unknown (or from an older peer).
    #[serde(default)]
    pub salt_version: Option<String>,
    /// The settings that decide which keys get accepted; `None` when the
    /// master config could not be read (or from an older peer).
    #[serde(default)]
    pub accept: Option<AcceptSettings>,
    /// Key counts when this report was made; `None` from an older peer.
    #[serde(default)]
    pub keys: Option<KeyCounts>,
    /// The salt-keysync version of the agent that made this report; `None`
    /// from an agent of 0.1.0, which did not send it.
    #[serde(default)]
    pub agent_version: Option<String>,
    /// Why something above is missing (local only, never sent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// Decision and key counts of a master.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCounts {
    pub accepted: usize,
    pub rejected: usize,
    /// Files in `minions_pre/` now (pending keys are per master).
    pub pending: usize,
    /// Delete decisions held (tombstones).
    pub deleted: usize,
}

/// What differs between this master and a peer. Unknown values (unreadable
/// here or not reported there) are not drift.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drift {
    pub master_pub_mismatch: bool,
    /// Names of the settings whose fingerprints differ ([`compared_settings`] order).
    pub settings: Vec<String>,
}

impl Drift {
    pub fn is_empty(&self) -> bool {
        !self.master_pub_mismatch && self.settings.is_empty()
    }
}

/// Reads this master's health: `pki_dir/master.pub` and the settings from
/// `master_config` plus `master.d/*.conf` beside it, and this agent's
/// version (the salt-master version and the key counts come from elsewhere).
pub fn local_health(pki_dir: &Path, master_config: &Path) -> MasterHealth {
    let mut health = MasterHealth { agent_version: Some(env!("CARGO_PKG_VERSION").into()), ..MasterHealth::default() };
    match master_pub_fingerprint(pki_dir) {
        Ok(fingerprint) => health.master_pub = Some(fingerprint),
        Err(e) => health.errors.push(e),
    }
    match load_master_config(master_config) {
        Ok(config) => {
            health.settings = fingerprints_of(&config);
            let (accept, errors) = accept_settings(&config);
            health.accept = Some(accept);
            health.errors.extend(errors);
        }
        Err(e) => health.errors.push(e),
    }
    health
}

/// The sha256 of `master.pub` as `salt-key -F master` prints it. In Salt
/// 3008 `master.pub` is a symlink to `<hostname>.pub`; following it is
/// fine here: the content must be a public key, and only its hash is kept.
pub fn master_pub_fingerprint(pki_dir: &Path) -> Result<String, String> {
    let path = pki_dir.join("master.pub");
    let bytes = read_capped(&path, 64 * 1024)?;
    check_public_key(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Fingerprint::of(&bytes).to_string())
}

/// Fingerprints of [`SETTINGS`] as the master sees them (see [`load_master_config`]).
pub fn settings_fingerprints(master_config: &Path) -> Result<BTreeMap<String, String>, String> {
    load_master_config(master_config).map(|config| fingerprints_of(&config))
}

/// The master config as the master sees it: the config file, overridden
/// per top-level key by `master.d/*.conf` (merged in name order, nested
/// maps merged, lists concatenated, as Salt's `include_config` does). A
/// missing config file means every setting is Salt's default.
pub fn load_master_config(master_config: &Path) -> Result<Yaml, String> {
    let mut merged = match std::fs::symlink_metadata(master_config) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Yaml::Hash(Default::default()),
        _ => load_yaml(master_config)?,
    };
    let include_dir = master_config.parent().unwrap_or(Path::new(".")).join("master.d");
    let mut includes: Vec<_> = match std::fs::read_dir(&include_dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|ext| ext == "conf"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("cannot list {}: {e}", include_dir.display())),
    };
    includes.sort();
    let mut included = Yaml::Hash(Default::default());
    for path in &includes {
        deep_merge(&mut included, load_yaml(path)?);
    }
    if let (Yaml::Hash(main), Yaml::Hash(extra)) = (&mut merged, included) {
        for (key, value) in extra {
            main.insert(key, value);
        }
    }
    Ok(merged)
}

fn fingerprints_of(merged: &Yaml) -> BTreeMap<String, String> {
    SETTINGS
        .iter()
        .map(|name| {
            let value = &merged[*name];
            let fingerprint = match value {
                Yaml::BadValue | Yaml::Null => UNSET.to_string(),
                value => {
                    let mut canonical = String::new();
                    canonicalize(value, &mut canonical);
                    hex::encode(Sha256::digest(canonical.as_bytes()))
                }
            };
            (name.to_string(), fingerprint)
        })
        .collect()
}

/// What differs between `ours` and `theirs`.
pub fn compare(ours: &MasterHealth, theirs: &MasterHealth) -> Drift {
    let master_pub_mismatch = matches!((&ours.master_pub, &theirs.master_pub), (Some(a), Some(b)) if a != b);
    let mut settings: Vec<String> = SETTINGS
        .iter()
        .filter(|name| matches!((ours.settings.get(**name), theirs.settings.get(**name)), (Some(a), Some(b)) if a != b))
        .map(|name| name.to_string())
        .collect();
    if let (Some(ours), Some(theirs)) = (&ours.accept, &theirs.accept) {
        let (ours, theirs) = (ours.fingerprints(), theirs.fingerprints());
        settings
            .extend(ACCEPT_SETTINGS.iter().filter(|name| ours[*name] != theirs[*name]).map(|name| name.to_string()));
    }
    Drift { master_pub_mismatch, settings }
}

fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > max {
        return Err(format!("{} is larger than {max} bytes", path.display()));
    }
    Ok(bytes)
}

fn load_yaml(path: &Path) -> Result<Yaml, String> {
    let bytes = read_capped(path, MAX_CONFIG_BYTES)?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8", path.display()))?;
    let docs = YamlLoader::load_from_str(&text).map_err(|e| format!("{} is not valid YAML: {e}", path.display()))?;
    match docs.into_iter().next() {
        None | Some(Yaml::Null) => Ok(Yaml::Hash(Default::default())),
        Some(hash @ Yaml::Hash(_)) => Ok(hash),
        Some(_) => Err(format!("{} is not a YAML mapping", path.display())),
    }
}

/// Salt's `dictupdate.update(dest, upd, recursive_update=True, merge_lists=True)`.
fn deep_merge(dest: &mut Yaml, update: Yaml) {
    match (dest, update) {
        (Yaml::Hash(dest), Yaml::Hash(update)) => {
            for (key, value) in update {
                match dest.get_mut(&key) {
                    Some(existing) => deep_merge(existing, value),
                    None => {
                        dest.insert(key, value);
                    }
                }
            }
        }
        (Yaml::Array(dest), Yaml::Array(update)) => dest.extend(update),
        (dest, update) => *dest = update,
    }
}

/// A canonical text of a YAML value: maps with sorted keys, so two masters
/// whose settings mean the same produce the same fingerprint however the
/// files are laid out.
fn canonicalize(value: &Yaml, out: &mut String) {
    match value {
        Yaml::Hash(hash) => {
            let mut entries: Vec<(String, &Yaml)> = hash
                .iter()
                .map(|(k, v)| {
                    let mut key = String::new();
                    canonicalize(k, &mut key);
                    (key, v)
                })
                .collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            out.push('{');
            for (idx, (key, value)) in entries.into_iter().enumerate() {
                if idx > 0 {
                    out.push(',');
                }
                out.push_str(&key);
                out.push(':');
                canonicalize(value, out);
            }
            out.push('}');
        }
        Yaml::Array(items) => {
            out.push('[');
            for (idx, item) in items.iter().enumerate() {
                if idx > 0 {
                    out.push(',');
                }
                canonicalize(item, out);
            }
            out.push(']');
        }
        Yaml::String(s) => out.push_str(&serde_json::to_string(s).unwrap_or_default()),
        Yaml::Integer(i) => out.push_str(&i.to_string()),
        Yaml::Real(r) => out.push_str(r),
        Yaml::Boolean(b) => out.push_str(if *b { "true" } else { "false" }),
        Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => out.push_str("null"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keysync_machine::testkit::PUB;

    fn write(dir: &Path, name: &str, text: &str) {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn layout_does_not_matter_but_values_do() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        write(
            a.path(),
            "master",
            "interface: 1.2.3.4\npublisher_acl:\n  fred:\n    - test.*\n    - pkg.*\n  bob: ['cmd.run']\n",
        );
        write(b.path(), "master", "interface: 5.6.7.8\n");
        write(b.path(), "master.d/acl.conf", "publisher_acl: {bob: [cmd.run], fred: [test.*, pkg.*]}\n");
        let fa = settings_fingerprints(&a.path().join("master")).unwrap();
        let fb = settings_fingerprints(&b.path().join("master")).unwrap();
        assert_eq!(fa, fb);
        assert_eq!(fa["nodegroups"], UNSET);
        assert_ne!(fa["publisher_acl"], UNSET);

        write(b.path(), "master.d/zz.conf", "publisher_acl:\n  eve: ['.*']\n");
        let fb = settings_fingerprints(&b.path().join("master")).unwrap();
        let ours = MasterHealth { settings: fa, ..MasterHealth::default() };
        let theirs = MasterHealth { settings: fb, ..MasterHealth::default() };
        assert_eq!(compare(&ours, &theirs).settings, vec!["publisher_acl".to_string()]);
    }

    #[test]
    fn key_acceptance_settings_are_read_with_the_rest_and_compared() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        write(a.path(), "master", "auto_accept: True\nkey_cache: sched\n");
        write(b.path(), "master", "key_cache: sched\n");
        write(b.path(), "master.d/accept.conf", "auto_accept: True\n");
        let ours = local_health(a.path(), &a.path().join("master"));
        let theirs = local_health(b.path(), &b.path().join("master"));
        assert_eq!(ours.accept, theirs.accept, "master.d counts as Salt counts it");
        assert!(ours.accept.as_ref().unwrap().auto_accept);
        assert!(compare(&ours, &theirs).settings.is_empty());
        write(b.path(), "master.d/accept.conf", "auto_accept: False\n");
        let theirs = local_health(b.path(), &b.path().join("master"));
        assert_eq!(compare(&ours, &theirs).settings, ["auto_accept"]);
        let older_peer = MasterHealth { accept: None, ..theirs };
        assert!(compare(&ours, &older_peer).settings.is_empty(), "unknown is not drift");
    }

    #[test]
    fn missing_config_is_unset_and_bad_yaml_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let settings = settings_fingerprints(&dir.path().join("master")).unwrap();
        assert!(settings.values().all(|v| v == UNSET), "{settings:?}");
        write(dir.path(), "master", "publisher_acl: [unclosed\n");
        let err = settings_fingerprints(&dir.path().join("master")).unwrap_err();
        assert!(err.contains("is not valid YAML"), "{err}");
    }

    #[test]
    fn master_pub_is_hashed_and_private_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(master_pub_fingerprint(dir.path()).unwrap_err().contains("cannot read"));
        write(dir.path(), "master.pub", PUB);
        let fingerprint = master_pub_fingerprint(dir.path()).unwrap();
        assert_eq!(fingerprint, Fingerprint::of(PUB.as_bytes()).to_string());
        write(dir.path(), "master.pub", "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n");
        assert!(master_pub_fingerprint(dir.path()).is_err());

        let ours = MasterHealth { master_pub: Some("aa".into()), ..MasterHealth::default() };
        let unknown = MasterHealth::default();
        assert!(compare(&ours, &unknown).is_empty());
        let other = MasterHealth { master_pub: Some("bb".into()), ..MasterHealth::default() };
        assert!(compare(&ours, &other).master_pub_mismatch);
    }
}
