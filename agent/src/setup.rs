//! What `run`, `check`, `recover` and a reload load from the config before
//! they start: the TLS material (checked to name this node), the owner of
//! the files the agent writes, and the master id Salt writes into `.dfn`.

use anyhow::{Context, Result};
use keysync_server::{TlsMaterial, TlsSetup};

use crate::config::Config;
use crate::disk::pki::{Owner, Pki, PkiOptions, Trust, KEY_MODE_3008};

/// Loads the TLS material the config names.
pub fn load_tls(config: &Config) -> Result<TlsSetup> {
    tls_setup(config, &load_tls_material(config)?)
}

/// Reads the three PEM files the config names.
pub fn load_tls_material(config: &Config) -> Result<TlsMaterial> {
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).with_context(|| format!("cannot read {what} {}", path.display()))
    };
    Ok(TlsMaterial {
        ca_pem: read(&config.tls.ca, "tls.ca")?,
        cert_pem: read(&config.tls.cert, "tls.cert")?,
        key_pem: read(&config.tls.key, "tls.key")?,
    })
}

/// Builds the TLS setup and checks that it names this node.
pub fn tls_setup(config: &Config, material: &TlsMaterial) -> Result<TlsSetup> {
    let tls = TlsSetup::new(material).with_context(|| {
        format!(
            "tls.ca {}, tls.cert {}, tls.key {}",
            config.tls.ca.display(),
            config.tls.cert.display(),
            config.tls.key.display()
        )
    })?;
    if !tls.own_dns_names().contains(&config.node) {
        anyhow::bail!(
            "node {:?} is not a DNS name of tls.cert {} (it names {:?})",
            config.node,
            config.tls.cert.display(),
            tls.own_dns_names()
        );
    }
    Ok(tls)
}

/// The owner for files the agent writes: `salt.user`, else pki_dir's owner.
pub fn salt_owner(config: &Config) -> Result<Owner> {
    match &config.salt.user {
        Some(user) => Owner::from_user(user).with_context(|| format!("salt.user {user:?}")),
        None => Owner::of_path(&config.pki_dir).with_context(|| format!("pki_dir {}", config.pki_dir.display())),
    }
}

/// How the agent opens the key folders: files owned as Salt owns them, and
/// folders trusted if owned by root, the agent's user or that owner.
pub fn pki_options(config: &Config, create: bool) -> Result<PkiOptions> {
    let owner = salt_owner(config)?;
    let key_mode = config.salt.key_mode.unwrap_or(KEY_MODE_3008);
    Ok(PkiOptions { owner, trust: Trust::of(owner.uid, owner.gid), key_mode, create })
}

/// Opens pki_dir, its key folders and the agent's staging folder (see `disk::pki`).
pub fn open_pki(config: &Config, create: bool) -> Result<Pki> {
    let options = pki_options(config, create)?;
    Pki::open(&config.pki_dir, options).with_context(|| "cannot use the key folders".to_string())
}

/// The master id Salt 3008 writes into `.dfn`: `salt.master_id`, else
/// `<hostname>_master` as Salt derives it.
pub fn master_id(config: &Config) -> String {
    config.salt.master_id.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}_master", host.trim())
    })
}
