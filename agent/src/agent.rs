//! Wires an agent together: opens the store, audit log and key folders,
//! starts the watcher, the core task, the gRPC listener and one link per peer.

use std::sync::Arc;

use anyhow::{Context, Result};
use keysync_server::{ServeOptions, TlsMaterial, TlsSetup};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit::{AuditLog, Record};
use crate::config::Config;
use crate::core::settle::SettleTimings;
use crate::node::{self, CoreParts, CoreSettings};
use crate::peers::{PeerLink, MAX_MESSAGE_BYTES};
use crate::pki::{Owner, Pki};
use crate::rpc::{audit_transport, RpcHandler};
use crate::store::Store;

/// Loads the TLS material the config names.
pub fn load_tls(config: &Config) -> Result<TlsSetup> {
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).with_context(|| format!("cannot read {what} {}", path.display()))
    };
    let material = TlsMaterial {
        ca_pem: read(&config.tls.ca, "tls.ca")?,
        cert_pem: read(&config.tls.cert, "tls.cert")?,
        key_pem: read(&config.tls.key, "tls.key")?,
    };
    let tls = TlsSetup::new(&material)?;
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

/// The master id Salt 3008 writes into `.dfn`: `salt.master_id`, else
/// `<hostname>_master` as Salt derives it.
pub fn master_id(config: &Config) -> String {
    config.salt.master_id.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}_master", host.trim())
    })
}

/// Runs an agent until `shutdown`. `listener` is bound by the caller (tests
/// bind 127.0.0.1:0); `None` binds `config.listen`.
pub async fn run(config: Config, listener: Option<TcpListener>, shutdown: CancellationToken) -> Result<()> {
    crate::fault::announce();
    let tls = Arc::new(load_tls(&config)?);
    let owner = salt_owner(&config)?;
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("cannot create state_dir {}", config.state_dir.display()))?;
    let audit = Arc::new(AuditLog::open(&config.audit_log, &config.node)?);
    let store = Store::open(&config.state_dir, &config.node).with_context(|| {
        format!(
            "cannot open the state store; if it is corrupt, rebuild it with `{} --config FILE` (docs/recovery.md)",
            crate::state_guard::RECOVER_COMMAND
        )
    })?;
    // A lost or replaced state folder is refused, not taken for a first start.
    crate::state_guard::check(&config.pki_dir, &store, &config.state_dir)?;
    let store_id = store.id().to_string();
    let pki = Pki::new(config.pki_dir.clone(), owner);
    pki.ensure_folders().with_context(|| format!("cannot create the key folders in {}", config.pki_dir.display()))?;
    let n_stale = pki.clean_staging().context("cannot remove stale staging files")?;
    if n_stale > 0 {
        tracing::info!(n = n_stale, "removed staging files left by a crash");
    }
    let listener = match listener {
        Some(listener) => listener,
        None => {
            TcpListener::bind(config.listen).await.with_context(|| format!("cannot listen on {}", config.listen))?
        }
    };

    // Watching starts before the start-up scan, so nothing changed during it is missed.
    let (watch, events) = crate::watcher::watch(&config.pki_dir)
        .with_context(|| format!("cannot watch the key folders in {}", config.pki_dir.display()))?;
    let settings = CoreSettings {
        node: config.node.clone(),
        cachedir: config.salt.cachedir.clone(),
        master_id: master_id(&config),
        max_clock_skew: config.timings.max_clock_skew,
        rescan_interval: config.timings.rescan_interval,
    };
    let settle = SettleTimings { absent_grace: config.timings.absent_grace, ..SettleTimings::default() };
    let (core, handle, requests) = node::start(CoreParts { settings, store, pki, owner, audit: audit.clone(), settle })
        .with_context(|| {
            format!(
                "cannot load the state store; if it is corrupt, rebuild it with `{} --config FILE` (docs/recovery.md)",
                crate::state_guard::RECOVER_COMMAND
            )
        })?;
    // The store is initialized now: from here on its loss is detected.
    crate::state_guard::mark(&config.pki_dir, &store_id, &config.node)?;
    audit.record(Record {
        reason: Some(format!("listening on {}, {} peers", listener.local_addr()?, config.peers.len())),
        ..Record::new("start", "local", "started")
    });
    tracing::info!(node = %config.node, listen = %listener.local_addr()?, n_peers = config.peers.len(), "agent started");

    let tasks = TaskTracker::new();
    tasks.spawn(core.run(events, requests, shutdown.clone()));
    let handler = Arc::new(RpcHandler { node: config.node.clone(), core: handle.clone(), audit: audit.clone() });
    let opts = ServeOptions {
        allowed_peers: config.peers.iter().map(|p| p.name.clone()).collect(),
        max_message_bytes: MAX_MESSAGE_BYTES,
        ..ServeOptions::default()
    };
    for peer in &config.peers {
        let link = PeerLink {
            peer: peer.clone(),
            node: config.node.clone(),
            tls: tls.clone(),
            core: handle.clone(),
            audit: audit.clone(),
            anti_entropy_interval: config.timings.anti_entropy_interval,
            reconnect_max: config.timings.reconnect_max,
        };
        tasks.spawn(link.run(shutdown.clone()));
    }
    tasks.close();
    let served =
        keysync_server::serve(listener, &tls, opts, handler, audit_transport(audit.clone()), shutdown.clone()).await;
    shutdown.cancel();
    tasks.wait().await;
    drop(watch);
    audit.record(Record::new("stop", "local", "stopped"));
    audit.sync();
    served.context("gRPC listener failed")
}
