//! Wires an agent together: opens the store, audit log and key folders,
//! starts the watcher, the core task, the gRPC listener and one link per peer.

use std::sync::Arc;

use anyhow::{Context, Result};
use keysync_server::{ListenerControl, ServeOptions};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, Mode};
use crate::core::settle::SettleTimings;
use crate::disk::audit::{Action, Outcome, Via};
use crate::disk::audit::{AuditLog, Record};
use crate::disk::store::Store;
use crate::net::links::{LinkContext, PeerLinks};
use crate::net::peers::MAX_MESSAGE_BYTES;
use crate::net::rpc::{audit_transport, RpcHandler};
use crate::node::{self, CoreParts, CoreSettings};
use crate::ops::sd_notify::Notifier;
use crate::setup::{load_tls_material, master_id, open_pki, salt_owner, tls_setup};

/// Observe mode never rescans (it reads the folders once, at its start).
const OBSERVE_NO_RESCAN: std::time::Duration = std::time::Duration::from_secs(10 * 365 * 24 * 3600);

/// What the binary adds to [`run`]: where the config came from and a
/// channel of reload requests (SIGHUP), and systemd notifications.
#[derive(Default)]
pub struct RunOptions {
    /// Re-read on every reload request; without it requests are ignored.
    pub config_path: Option<std::path::PathBuf>,
    pub reload: Option<mpsc::Receiver<Option<crate::ops::reload::ReloadReply>>>,
    /// The sending side of `reload`, for `salt-keysync reload` over the
    /// control socket (it waits for the outcome, which SIGHUP cannot).
    pub reload_requests: Option<mpsc::Sender<Option<crate::ops::reload::ReloadReply>>>,
    pub notifier: Notifier,
    /// Called whenever a thread of the agent's own that runs async work (the
    /// core's, `node/thread.rs`) waits for work, as the binary's runtime
    /// workers call it (the binary returns freed memory there).
    pub on_thread_park: Option<fn()>,
}

/// Runs an agent until `shutdown`. `listener` is bound by the caller (tests
/// bind 127.0.0.1:0); `None` binds `config.listen`.
pub async fn run(config: Config, listener: Option<TcpListener>, shutdown: CancellationToken) -> Result<()> {
    run_with(config, listener, shutdown, RunOptions::default()).await
}

/// [`run`] with config reloads and systemd notifications.
pub async fn run_with(
    config: Config,
    listener: Option<TcpListener>,
    shutdown: CancellationToken,
    options: RunOptions,
) -> Result<()> {
    crate::fault::announce();
    // Refused before anything is read or written: too-open paths, or a
    // master whose key folders are not the truth.
    crate::disk::perms::enforce(&config)?;
    let salt = &config.salt;
    if crate::disk::salt_master::check_master_config(&salt.master_config, salt.master_config_named)
        .map_err(anyhow::Error::msg)?
        .is_none()
    {
        tracing::info!("{}", crate::disk::salt_master::defaults_assumed(&salt.master_config));
    }
    let material = load_tls_material(&config)?;
    let tls = tls_setup(&config, &material)?;
    let owner = salt_owner(&config)?;
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("cannot create state_dir {}", config.state_dir.display()))?;
    // Bound before the store, the audit log or the folders are touched: another agent on this state
    // folder, or a metrics port in use, stops the start while nothing changed. A start that fails
    // later removes it again (dropped).
    let control_socket = crate::ops::control::bind(&config.control_socket, &config.state_dir).await?;
    // An address another program holds is tried again for a while, then a
    // temporary failure (exit 75, restarted by the unit): see `net/listen.rs`.
    let metrics_listener = match config.metrics_listen {
        Some(address) => match crate::net::listen::bind("metrics_listen", address, &shutdown).await? {
            Some(listener) => Some(listener),
            None => return Ok(()),
        },
        None => None,
    };

    let observe = config.mode == Mode::Observe;
    let audit = Arc::new(AuditLog::open(&config.audit_log, &config.node)?);
    let store = if observe {
        // Nothing kept: the first start in normal mode afterwards is a first start.
        Arc::new(Store::in_memory(&config.node)?)
    } else {
        // A newer format or another user's file says what to do itself; only
        // what redb could not read may be corruption.
        Arc::new(Store::open(&config.state_dir, &config.node).map_err(|e| match e {
            crate::disk::store::StoreError::Db { .. } => anyhow::Error::new(e).context(format!(
                "cannot open the state store; if it is corrupt, rebuild it with `{} --config FILE` ({})",
                crate::disk::state_guard::RECOVER_COMMAND,
                crate::disk::state_guard::RECOVERY_GUIDE
            )),
            e => anyhow::Error::new(e),
        })?)
    };
    if !observe {
        // Records cut off the audit log while the agent was stopped are told.
        crate::disk::audit_guard::check(&store, &audit);
    }
    // Observe mode opens the folders as normal mode does (making the agent's
    // own staging folder if missing) but writes nothing into them.
    let pki = Arc::new(open_pki(&config, true)?);
    // One agent per pki_dir: a second (another state_dir or port) is refused
    // before it changes anything. Held until the agent exits.
    let _serving = pki.lock_serving().map_err(anyhow::Error::msg)?;
    // Where .dfn goes: a symlink or a stranger's folder is refused now, not
    // found out at the first revocation.
    if !crate::disk::pki::check_cachedir(&config.salt.cachedir, &pki.trust()).map_err(anyhow::Error::msg)? {
        tracing::warn!(cachedir = %config.salt.cachedir.display(), "salt.cachedir does not exist yet: .dfn cannot be dropped until salt-master makes it");
    }
    if let Some(refused) = pki.staging_refused() {
        tracing::error!(what = %refused, "the agent's staging folder in pki_dir was not its own");
        audit.record(Record {
            reason: Some(format!("{}/{}: {refused}", config.pki_dir.display(), crate::disk::pki::STAGING_DIR)),
            ..Record::new(Action::Refuse, Via::Local, Outcome::Refused)
        });
    }
    if !observe {
        // A lost or replaced state folder is refused, not taken for a first start.
        crate::disk::state_guard::check(&pki, &store, &config.state_dir)?;
        let n_stale = pki.clean_staging().context("cannot remove stale staging files")?;
        if n_stale > 0 {
            tracing::info!(n = n_stale, "removed staging files left by a crash");
        }
    }
    let listener = match listener {
        Some(listener) => listener,
        None => match crate::net::listen::bind("listen", config.listen, &shutdown).await? {
            Some(listener) => listener,
            None => return Ok(()),
        },
    };

    // Watching starts before the start-up scan, so nothing changed during it
    // is missed. Observe mode reads the folders once, at its start: what the
    // plan shows is what they held then (restart it to read them again).
    let (watch, events, _no_events) = if observe {
        let (tx, rx) = mpsc::unbounded_channel();
        (None, rx, Some(tx))
    } else {
        let (watch, events) = crate::disk::watcher::watch(&config.pki_dir)
            .with_context(|| format!("cannot watch the key folders in {}", config.pki_dir.display()))?;
        (Some(Arc::new(watch)), events, None)
    };
    let settings = CoreSettings {
        node: config.node.clone(),
        cachedir: config.salt.cachedir.clone(),
        master_id: master_id(&config),
        max_clock_skew: config.timings.max_clock_skew,
        rescan_interval: if observe { OBSERVE_NO_RESCAN } else { config.timings.rescan_interval },
        observe,
        guard: config.guard.clone(),
        tombstone_ttl: config.timings.tombstone_ttl,
        masters: config.masters(),
    };
    let settle = SettleTimings { absent_grace: config.timings.absent_grace, ..SettleTimings::default() };
    let mut metrics = crate::ops::metrics::Metrics::new(&config.node);
    metrics.count_audit_failures(audit.write_failures());
    let metrics = Arc::new(metrics);
    let (starting, handle, requests) = node::prepare(CoreParts {
        settings,
        store: store.clone(),
        pki: pki.clone(),
        owner,
        audit: audit.clone(),
        settle,
        metrics: metrics.clone(),
        watch: watch.clone(),
    });
    let board = Arc::new(crate::ops::board::Board::new(&config, audit.clone(), metrics.clone()));
    let tasks = TaskTracker::new();
    // The core blocks on the disk: a thread of its own, never an async
    // worker. Its start (the store read, the folders reconciled: tens of
    // seconds at 1,000,000 keys) runs there too. From here on, however
    // `run_with` returns, the core (and every task) is told to stop.
    let _stop_on_return = shutdown.clone().drop_guard();
    let listen_address = listener.local_addr()?;
    let (core, started) = starting
        .spawn(events, requests, shutdown.clone(), options.on_thread_park)
        .context("cannot start the core's thread")?;
    let (tls_tx, tls_rx) = watch::channel(Arc::new(tls));
    // Peers are answered while the core starts: their TLS handshakes are
    // done at once, and what they ask waits in the core's queue until it
    // runs. A listener bound but not served timed their handshakes out
    // (10 s) for as long as a large first start took.
    let handler = Arc::new(RpcHandler {
        node: config.node.clone(),
        observe,
        core: handle.clone(),
        audit: audit.clone(),
        board: board.clone(),
    });
    let opts = ServeOptions { max_message_bytes: MAX_MESSAGE_BYTES, ..ServeOptions::default() };
    let control =
        ListenerControl::new(tls_rx.borrow().as_ref().clone(), config.peers.iter().map(|p| p.name.clone()).collect());
    control.set_peer_sources(crate::net::rpc::peer_sources(&config.peers).await);
    let serving = tokio::spawn(keysync_server::serve_with(
        listener,
        control.clone(),
        opts,
        handler,
        audit_transport(audit.clone()),
        shutdown.clone(),
    ));
    // The control socket too: `status` and the other requests are answered
    // that the agent is starting, until it is done.
    let start = crate::ops::control::StartGate::new();
    let control_ctx = Arc::new(crate::ops::control::ControlContext {
        board: board.clone(),
        core: handle.clone(),
        // Only where a reloader will answer.
        reload: options.reload_requests.clone().filter(|_| options.config_path.is_some() && options.reload.is_some()),
        config_path: options.config_path.clone(),
        plan: crate::ops::site_plan::Gather {
            node: config.node.clone(),
            observe,
            core: handle.clone(),
            tls: tls_rx.clone(),
            max_message_bytes: MAX_MESSAGE_BYTES,
        },
        start: start.clone(),
    });
    tasks.spawn(crate::ops::control::serve(control_socket, control_ctx, shutdown.clone()));
    options.notifier.send("STATUS=starting: reading the state store and reconciling the key folders with it");
    // A start that failed ends the agent: the listeners are stopped first.
    let failed = match started.await {
        Ok(Ok(())) => None,
        Ok(Err(node::StartError::Mark(e))) => Some(anyhow::Error::new(e)),
        Ok(Err(node::StartError::Store(e))) => Some(anyhow::Error::new(e).context(format!(
            "cannot load the state store; if it is corrupt, rebuild it with `{} --config FILE` ({})",
            crate::disk::state_guard::RECOVER_COMMAND,
            crate::disk::state_guard::RECOVERY_GUIDE
        ))),
        // The thread ended without a word: its start panicked.
        Err(_) => Some(anyhow::anyhow!("the core stopped at its start")),
    };
    if let Some(failed) = failed {
        shutdown.cancel();
        let _ = serving.await;
        tasks.close();
        tasks.wait().await;
        return Err(match core.stopped().await {
            Err(stopped @ node::CoreStopped::Panicked(_)) => stopped.into(),
            _ => failed,
        });
    }
    // The core's thread marked the store as initialized (see `Starting::spawn`).
    start.open();
    let observing = if observe { ", observe mode: nothing is written to the key folders" } else { "" };
    audit.record(Record {
        reason: Some(format!("listening on {listen_address}, {} peers{observing}", config.peers.len())),
        ..Record::new(Action::Start, Via::Local, Outcome::Started)
    });
    tracing::info!(node = %config.node, listen = %listen_address, n_peers = config.peers.len(), observe, "agent started");

    let core_stopped = tasks.spawn({
        let shutdown = shutdown.clone();
        async move {
            let stopped = core.stopped().await;
            // Without its core the agent replicates nothing: it stops
            // (exit 1, and systemd starts it again) instead of running on.
            if let Err(e) = &stopped {
                tracing::error!(error = %e, "the agent stops");
                shutdown.cancel();
            }
            stopped
        }
    });
    if let Some(listener) = metrics_listener {
        tracing::info!(address = %listener.local_addr()?, "serving Prometheus metrics on /metrics");
        let (metrics, shutdown, allow) = (metrics.clone(), shutdown.clone(), config.metrics_allow.clone());
        tasks.spawn(async move {
            if let Err(e) = crate::ops::metrics::serve(listener, allow, metrics, shutdown).await {
                tracing::error!(error = %e, "metrics listener failed");
            }
        });
    }
    let links = PeerLinks::start(
        LinkContext {
            node: config.node.clone(),
            tls: tls_rx,
            core: handle.clone(),
            audit: audit.clone(),
            anti_entropy_interval: config.timings.anti_entropy_interval,
            reconnect_max: config.timings.reconnect_max,
            board: board.clone(),
            listener: control.clone(),
            tasks: tasks.clone(),
            shutdown: shutdown.clone(),
        },
        &config.peers,
    );
    let notifier = options.notifier;
    let status = format!("listening on {listen_address}, {} peers", config.peers.len());
    if let (Some(config_path), Some(requests)) = (options.config_path, options.reload) {
        let reloader = crate::ops::reload::Reloader {
            config_path,
            current: config.clone(),
            material,
            control: control.clone(),
            tls: tls_tx,
            links,
            audit: audit.clone(),
            notifier: notifier.clone(),
            board: board.clone(),
        };
        tasks.spawn(reloader.run(requests, shutdown.clone()));
    }
    if observe {
        // Observe mode writes nothing to the key folders.
    } else if config.salt.key_mode.is_none() {
        tasks.spawn(follow_key_mode(pki.clone(), board.clone(), audit.clone(), shutdown.clone()));
    } else {
        tasks.spawn({
            let (pki, audit) = (pki.clone(), audit.clone());
            async move { narrow_key_modes(&pki, &audit).await }
        });
    }
    tasks.spawn(notifier.clone().watchdog(handle.clone(), shutdown.clone()));
    tasks.spawn({
        // A peer that stopped sending refused things still gets its count told.
        let (audit, shutdown) = (audit.clone(), shutdown.clone());
        async move {
            let mut every = tokio::time::interval(crate::disk::audit::refusals::WINDOW / 4);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = every.tick() => audit.flush_refusals(false),
                }
            }
        }
    });
    tasks.spawn({
        let (notifier, shutdown) = (notifier.clone(), shutdown.clone());
        async move {
            shutdown.cancelled().await;
            notifier.stopping();
        }
    });
    tasks.close();
    // Listening and the folders reconciled (the core's start did it).
    notifier.ready(&status);
    let served = match serving.await {
        Ok(served) => served.map_err(anyhow::Error::from),
        Err(e) => Err(anyhow::anyhow!("the gRPC listener's task ended: {e}")),
    };
    shutdown.cancel();
    tasks.wait().await;
    drop(watch);
    // The core has made its final audit flush (or failed).
    let core_stopped = core_stopped.await.unwrap_or_else(|e| Err(node::CoreStopped::Panicked(e.to_string())));
    audit.flush_refusals(true);
    audit.record(Record {
        reason: core_stopped.as_ref().err().map(ToString::to_string),
        ..Record::new(Action::Stop, Via::Local, Outcome::Stopped)
    });
    audit.sync();
    // Where the chain ends at this clean stop: a cut tail is noticed at the
    // next start (in observe mode the store is in memory and gone with it).
    if let Err(e) = store.set_audit_head(&audit.head()) {
        tracing::error!(error = %e, "cannot note where the audit log ends");
    }
    core_stopped?;
    served.context("gRPC listener failed")
}

/// `salt.key_mode = "auto"`: key files get the mode the master's own
/// salt-key gives them (see `pki::key_mode_for`), followed as its version
/// is learnt and after an upgrade.
async fn follow_key_mode(
    pki: Arc<crate::disk::pki::Pki>,
    board: Arc<crate::ops::board::Board>,
    audit: Arc<AuditLog>,
    shutdown: CancellationToken,
) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
    // Key files are narrowed once, when the mode is first known.
    let mut narrowed = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        let Some(mode) = board.salt_version().as_deref().and_then(crate::disk::pki::key_mode_for) else { continue };
        if pki.key_mode() != mode || !narrowed {
            if pki.key_mode() != mode {
                tracing::info!(mode = format!("{mode:04o}"), version = ?board.salt_version(), "key files get the mode this master's Salt gives them");
                pki.set_key_mode(mode);
            }
            narrowed = true;
            narrow_key_modes(&pki, &audit).await;
        }
    }
}

/// Key files earlier releases left wider than this master's Salt writes
/// them get its mode (see `Pki::narrow_key_modes`), audited once with a count.
async fn narrow_key_modes(pki: &Arc<crate::disk::pki::Pki>, audit: &AuditLog) {
    let pki = pki.clone();
    let Ok((narrowed, failed)) = tokio::task::spawn_blocking(move || pki.narrow_key_modes()).await else { return };
    if narrowed + failed == 0 {
        return;
    }
    tracing::info!(narrowed, failed, "key files narrowed to 0600, as this master's Salt writes them");
    audit.record(Record {
        reason: Some(format!(
            "{narrowed} key files in minions/ and minions_rejected/ narrowed to 0600, as this master's Salt writes \
             them{}",
            if failed > 0 { format!("; {failed} could not be (not the agent's user's)") } else { String::new() }
        )),
        ..Record::new(Action::Mode, Via::Local, Outcome::Applied)
    });
}
