//! `salt-keysync certs init` and `certs issue NAME`: a small CA and node
//! certificates for sites without a PKI. The CA key stays in the folder where
//! it is made; only ca.pem and each node's own pair are copied to that node.
//! Nothing is ever overwritten: re-issuing means removing the old files first.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use keysync_server::CertAuthority;

const EXAMPLES: &str = "\
Examples:
  salt-keysync certs init --dir ./tls
  salt-keysync certs issue master-a --dir ./tls
  salt-keysync certs issue master-b --dir ./tls --days 365

Then copy ca.pem, master-a.pem and master-a.key to master-a as
/etc/salt-keysync/tls/{ca.pem,node.pem,node.key}; ca.key never leaves ./tls.";

#[derive(clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct CertsArgs {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(clap::Subcommand)]
enum CertsCommand {
    /// Make a CA: ca.pem (certificate, 0644) and ca.key (private key, 0600); refuses to overwrite.
    #[command(after_help = "Example:\n  salt-keysync certs init --dir ./tls")]
    Init {
        /// Folder for ca.pem and ca.key (created with mode 0700 if missing).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Common name of the CA certificate.
        #[arg(long, default_value = "salt-keysync CA")]
        name: String,
    },
    /// Issue a node certificate with DNS SAN NAME, signed by the CA in --dir: NAME.pem and NAME.key (0600).
    #[command(after_help = "Examples:\n  salt-keysync certs issue master-a --dir ./tls\n  \
                            salt-keysync certs issue master-b.example.com --dir ./tls --days 365")]
    Issue {
        /// The node's name: its `node` in config.toml and the `name` its peers list it under.
        name: String,
        /// Folder holding ca.pem and ca.key (from `certs init`); NAME.pem and NAME.key go there too.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Validity in days.
        #[arg(long, default_value_t = 825, value_parser = clap::value_parser!(i64).range(1..=36_500))]
        days: i64,
    },
}

pub fn certs(args: &CertsArgs) -> Result<()> {
    match &args.command {
        CertsCommand::Init { dir, name } => init(dir, name),
        CertsCommand::Issue { name, dir, days } => issue(dir, name, *days),
    }
}

fn init(dir: &Path, common_name: &str) -> Result<()> {
    let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
    for path in [&cert_path, &key_path] {
        refuse_existing(path, "remove it first to make a new CA (every node certificate must then be re-issued)")?;
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let ca = CertAuthority::new(common_name)?;
    write_pair(&cert_path, &ca.cert_pem(), &key_path, &ca.key_pem())?;
    crate::say!("CA {common_name:?}: keep {} private; copy {} to every node", key_path.display(), cert_path.display());
    Ok(())
}

fn issue(dir: &Path, name: &str, days: i64) -> Result<()> {
    let (ca_cert, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let read = |path: &Path| {
        fs::read_to_string(path).with_context(|| {
            format!("cannot read {} (make a CA first: salt-keysync certs init --dir {})", path.display(), dir.display())
        })
    };
    let ca = CertAuthority::from_pem(&read(&ca_cert)?, &read(&ca_key)?)
        .with_context(|| format!("{} and {}", ca_cert.display(), ca_key.display()))?;
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    // The name becomes a file name: only a DNS name (which certgen checks too) may.
    if name.is_empty() || name.starts_with('.') || name.contains('/') {
        anyhow::bail!("{name:?} is not a DNS name");
    }
    for path in [&cert_path, &key_path] {
        refuse_existing(path, "remove it first to re-issue")?;
    }
    let now = time::OffsetDateTime::now_utc();
    // Backdated an hour so that a peer whose clock is slightly behind accepts it at once.
    let issued = ca
        .issue(&[name], now - time::Duration::hours(1), now + time::Duration::days(days))
        .with_context(|| format!("cannot issue a certificate for {name:?}"))?;
    write_pair(&cert_path, &issued.cert_pem, &key_path, &issued.key_pem)?;
    crate::say!(
        "certificate for {name:?}, valid {days} days: install {} as tls.cert and {} as tls.key",
        cert_path.display(),
        key_path.display()
    );
    Ok(())
}

fn refuse_existing(path: &Path, hint: &str) -> Result<()> {
    if fs::symlink_metadata(path).is_ok() {
        anyhow::bail!("{} already exists; {hint}", path.display());
    }
    Ok(())
}

/// Writes a certificate (0644) and its key (0600), each created new; if the
/// second cannot be written the first is removed, so no half pair is left.
fn write_pair(cert_path: &Path, cert: &str, key_path: &Path, key: &str) -> Result<()> {
    write_new(key_path, key, 0o600)?;
    if let Err(e) = write_new(cert_path, cert, 0o644) {
        let _ = fs::remove_file(key_path);
        return Err(e);
    }
    Ok(())
}

fn write_new(path: &Path, text: &str, mode: u32) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    if let Err(e) = file.write_all(text.as_bytes()).and_then(|()| file.sync_all()) {
        let _ = fs::remove_file(path);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    crate::say!("wrote {} (mode {mode:04o})", path.display());
    Ok(())
}
