//! Reloading the config without a restart (SIGHUP, `systemctl reload`):
//! peers and TLS material change live; everything else needs a restart, so
//! a new config that changes anything else — or that does not parse, or
//! names certificates that do not load — is refused whole, with the reason
//! logged and audited, and the running config stays in force.

use std::path::PathBuf;
use std::sync::Arc;

use keysync_server::{ListenerControl, TlsMaterial, TlsSetup};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::disk::audit::{Action, Outcome, Via};
use crate::disk::audit::{AuditLog, Record};
use crate::net::links::PeerLinks;
use crate::ops::sd_notify::Notifier;
use crate::setup::{load_tls_material, tls_setup};

/// Where the outcome of one reload goes: a summary of what changed, or why it was refused.
pub type ReloadReply = oneshot::Sender<Result<String, String>>;

/// Owns what a reload changes: the running config, the listener's control,
/// the TLS material links connect with, and the set of links.
pub struct Reloader {
    pub config_path: PathBuf,
    pub current: Config,
    pub material: TlsMaterial,
    pub control: ListenerControl,
    pub tls: watch::Sender<Arc<TlsSetup>>,
    pub links: PeerLinks,
    pub audit: Arc<AuditLog>,
    pub notifier: Notifier,
    /// Asked to learn the salt-master version again (Salt may have been upgraded).
    pub board: Arc<crate::ops::board::Board>,
}

impl Reloader {
    /// Reloads once per request until `shutdown`.
    pub async fn run(mut self, mut requests: mpsc::Receiver<Option<ReloadReply>>, shutdown: CancellationToken) {
        loop {
            let request = tokio::select! {
                () = shutdown.cancelled() => return,
                request = requests.recv() => request,
            };
            let Some(reply) = request else {
                // No one can ask any more; the links still live until shutdown.
                shutdown.cancelled().await;
                return;
            };
            let outcome = self.reload();
            if outcome.is_ok() {
                let sources = crate::net::rpc::peer_sources(&self.current.peers).await;
                self.control.set_peer_sources(sources);
            }
            if let Some(reply) = reply {
                let _ = reply.send(outcome);
            }
        }
    }

    /// Re-reads the config file and applies it, or refuses it whole.
    pub fn reload(&mut self) -> Result<String, String> {
        self.notifier.reloading();
        self.board.refresh_salt_version();
        let outcome = self.try_reload().map_err(|e| crate::text::error_chain(e.as_ref()));
        match &outcome {
            Ok(summary) => {
                tracing::info!(config = %self.config_path.display(), %summary, "config reloaded");
                self.audit.record(Record {
                    reason: Some(summary.clone()),
                    ..Record::new(Action::Reload, Via::Local, Outcome::Applied)
                });
            }
            Err(reason) => {
                tracing::error!(config = %self.config_path.display(), error = %reason, "config reload refused; the running config stays in force");
                self.audit.record(Record {
                    reason: Some(reason.clone()),
                    ..Record::new(Action::Reload, Via::Local, Outcome::Refused)
                });
            }
        }
        let status = match &outcome {
            Ok(_) => format!("{} peers; config reloaded", self.current.peers.len()),
            Err(reason) => format!("{} peers; reload refused: {reason}", self.current.peers.len()),
        };
        self.notifier.ready(&status);
        outcome
    }

    fn try_reload(&mut self) -> anyhow::Result<String> {
        let new = Config::load(&self.config_path)?;
        refuse_restart_only_changes(&self.current, &new)?;
        // The same permission rules as at start-up: a reload must not slip in a
        // world-readable key or config.
        crate::disk::perms::check_config_file(&self.config_path)?;
        crate::disk::perms::enforce(&new)?;
        let material = load_tls_material(&new)?;
        let tls = tls_setup(&new, &material)?;
        let ca_changed = material.ca_pem != self.material.ca_pem;
        let own_changed = material.cert_pem != self.material.cert_pem || material.key_pem != self.material.key_pem;

        let names = new.peers.iter().map(|p| p.name.clone()).collect();
        let n_cut = self.control.reload(tls.clone(), names).len();
        // New trust anchors: every peer proves itself again, in both directions.
        let n_closed = if ca_changed { self.control.close_connections() } else { 0 };
        self.tls.send_replace(Arc::new(tls));
        let changes = self.links.update(&new.peers, ca_changed);
        self.links.set_masters(new.masters());

        let mut summary = changes.to_string();
        match (ca_changed, own_changed) {
            (true, _) => summary.push_str("; CA and certificate reloaded, every connection re-established"),
            (false, true) => summary.push_str("; certificate reloaded for new connections"),
            (false, false) => summary.push_str("; TLS material unchanged"),
        }
        if n_cut + n_closed > 0 {
            summary.push_str(&format!("; {} inbound connection(s) closed", n_cut + n_closed));
        }
        self.current = new;
        self.material = material;
        Ok(summary)
    }
}

/// Only `[[peer]]` and `[tls]` apply live. Any other difference refuses the
/// reload, naming the keys, so nothing is half-applied.
fn refuse_restart_only_changes(old: &Config, new: &Config) -> anyhow::Result<()> {
    let mut changed = Vec::new();
    let mut check = |key: &str, differs: bool| {
        if differs {
            changed.push(key.to_string());
        }
    };
    check("node", old.node != new.node);
    check("pki_dir", old.pki_dir != new.pki_dir);
    check("state_dir", old.state_dir != new.state_dir);
    check("listen", old.listen != new.listen);
    check("audit_log", old.audit_log != new.audit_log);
    check("log_format", old.log_format != new.log_format);
    check("salt.master_config", old.salt.master_config != new.salt.master_config);
    check("salt.cachedir", old.salt.cachedir != new.salt.cachedir);
    check("salt.master_id", old.salt.master_id != new.salt.master_id);
    check("salt.user", old.salt.user != new.salt.user);
    let (a, b) = (&old.timings, &new.timings);
    check("timings.anti_entropy_interval", a.anti_entropy_interval != b.anti_entropy_interval);
    check("timings.rescan_interval", a.rescan_interval != b.rescan_interval);
    check("timings.max_clock_skew", a.max_clock_skew != b.max_clock_skew);
    check("timings.absent_grace", a.absent_grace != b.absent_grace);
    check("timings.reconnect_max", a.reconnect_max != b.reconnect_max);
    if changed.is_empty() {
        // Keys added to Config later are caught here, if not by name.
        let mut probe = new.clone();
        probe.peers = old.peers.clone();
        probe.tls = old.tls.clone();
        probe.retired_masters = old.retired_masters.clone();
        if format!("{probe:?}") != format!("{old:?}") {
            changed.push("a setting other than [[peer]], retired_masters and [tls]".to_string());
        }
    }
    if changed.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{} cannot change while running (only [[peer]], retired_masters and [tls] reload live); restart the agent to apply it",
        changed.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const BASE: &str = r#"
node = "master-a"
state_dir = "/var/lib/salt-keysync"
[tls]
ca = "/tls/ca.pem"
cert = "/tls/node.pem"
key = "/tls/node.key"
[[peer]]
name = "master-b"
address = "10.0.0.12:4515"
"#;

    fn config(text: &str) -> Config {
        Config::parse(text, Path::new("/etc/salt-keysync/config.toml")).unwrap()
    }

    #[test]
    fn peers_and_tls_may_change_everything_else_is_named() {
        let old = config(BASE);
        let peers = format!("{BASE}\n[[peer]]\nname = \"master-c\"\naddress = \"10.0.0.13:4515\"\n");
        assert!(refuse_restart_only_changes(&old, &config(&peers)).is_ok());
        assert!(refuse_restart_only_changes(&old, &config(&BASE.replace("node.pem", "new.pem"))).is_ok());

        let cases = [
            (BASE.replace("node = \"master-a\"", "node = \"master-z\""), "node cannot change"),
            (BASE.replace("/var/lib/salt-keysync", "/srv/keysync"), "state_dir, audit_log cannot change"),
            (format!("pki_dir = \"/srv/pki\"\n{BASE}"), "pki_dir cannot change"),
            (format!("listen = \"0.0.0.0:1\"\n{BASE}"), "listen cannot change"),
            (format!("{BASE}\n[timings]\nabsent_grace = \"1s\""), "timings.absent_grace cannot change"),
        ];
        for (text, want) in cases {
            let err = refuse_restart_only_changes(&old, &config(&text)).unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
            assert!(err.contains("restart the agent"), "{err}");
        }
    }
}
