//! `salt-keysync certs`: a small CA and node certificates for sites without
//! a PKI. The CA key stays where it is made; copy only ca.pem and each
//! node's own pair to that node.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use keysync_server::CertAuthority;

#[derive(clap::Args)]
pub struct CertsArgs {
    /// Folder for ca.pem, ca.key and <name>.pem / <name>.key (an existing CA there is reused).
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Validity of node certificates, in days.
    #[arg(long, default_value_t = 825)]
    days: i64,
    /// Node names: each becomes the DNS SAN of one certificate (the `node` of that agent).
    #[arg(required = true)]
    names: Vec<String>,
}

pub fn certs(args: &CertsArgs) -> Result<()> {
    fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let (ca_cert, ca_key) = (args.out.join("ca.pem"), args.out.join("ca.key"));
    let ca = if ca_cert.exists() && ca_key.exists() {
        let cert = fs::read_to_string(&ca_cert).with_context(|| format!("cannot read {}", ca_cert.display()))?;
        let key = fs::read_to_string(&ca_key).with_context(|| format!("cannot read {}", ca_key.display()))?;
        println!("using the CA in {}", ca_cert.display());
        CertAuthority::from_pem(&cert, &key)?
    } else {
        let ca = CertAuthority::new("salt-keysync CA")?;
        write(&ca_cert, &ca.cert_pem(), 0o644)?;
        write(&ca_key, &ca.key_pem(), 0o600)?;
        ca
    };
    let now = time::OffsetDateTime::now_utc();
    for name in &args.names {
        let issued =
            ca.issue(&[name.as_str()], now - time::Duration::hours(1), now + time::Duration::days(args.days))?;
        write(&args.out.join(format!("{name}.pem")), &issued.cert_pem, 0o644)?;
        write(&args.out.join(format!("{name}.key")), &issued.key_pem, 0o600)?;
    }
    Ok(())
}

fn write(path: &Path, text: &str, mode: u32) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}
