//! The core's start: what it is built from, its channels made before the
//! store is read, then the store loaded and the folders reconciled, on the
//! caller's thread or on the core's own.

use std::sync::Arc;

use keysync_machine::node::{Node, Settings};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{masters, now, outgoing, thread, Core, CoreHandle, CoreSettings, CoreThread, Effects, Request};
use super::{OUTGOING_QUEUE, REQUEST_QUEUE};
use crate::core::settle::SettleTimings;
use crate::disk::audit::AuditLog;
use crate::disk::pki::{Owner, Pki};
use crate::disk::store::Store;
use crate::disk::watcher::{FolderWatch, WatchEvent};

/// Everything [`start`] needs that is opened outside the core.
pub struct CoreParts {
    pub settings: CoreSettings,
    pub store: Arc<Store>,
    pub pki: Arc<Pki>,
    pub owner: Owner,
    pub audit: Arc<AuditLog>,
    pub settle: SettleTimings,
    /// Counts applied, refused and conflicted decisions.
    pub metrics: Arc<crate::ops::metrics::Metrics>,
    /// The watch on the key folders (none in unit tests).
    pub watch: Option<Arc<FolderWatch>>,
}

/// The core before its start: its channels exist (the handle reaches it and
/// what is asked waits in its queue), the store is not read yet.
pub struct Starting {
    parts: CoreParts,
    outgoing: outgoing::Channel,
}

/// Why the core could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The state store could not be read or written.
    #[error(transparent)]
    Store(#[from] crate::disk::store::StoreError),
    /// The marker that tells a lost state folder could not be written.
    #[error(transparent)]
    Mark(#[from] crate::disk::state_guard::GuardError),
}

/// The core's channels and its handle; [`Starting::start`] or
/// [`Starting::spawn`] loads the store and reconciles the folders.
pub fn prepare(parts: CoreParts) -> (Starting, CoreHandle, mpsc::Receiver<Request>) {
    let outgoing = outgoing::Channel::new(OUTGOING_QUEUE);
    let (tx, rx) = mpsc::channel(REQUEST_QUEUE);
    let stager = (!parts.settings.observe).then(|| parts.pki.clone());
    (Starting { parts, outgoing: outgoing.clone() }, CoreHandle { requests: tx, outgoing, stager }, rx)
}

/// [`prepare`] and [`Starting::start`] at once, on the caller's thread.
pub fn start(parts: CoreParts) -> Result<(Core, CoreHandle, mpsc::Receiver<Request>), StartError> {
    let (starting, handle, requests) = prepare(parts);
    Ok((starting.start()?, handle, requests))
}

impl Starting {
    /// Loads the store, finishes an interrupted apply and reconciles the
    /// folders with the store: the core, ready to run. At a first start on
    /// 1,000,000 keys this takes tens of seconds.
    pub fn start(self) -> Result<Core, StartError> {
        let Starting { parts, outgoing } = self;
        std::thread::sleep(crate::fault::start_delay());
        let loaded = parts.store.load()?;
        let settings = Settings {
            node: parts.settings.node.as_str().into(),
            max_clock_skew: parts.settings.max_clock_skew,
            rescan_interval: parts.settings.rescan_interval,
            rescan_step: keysync_machine::node::RESCAN_STEP,
            fetch_chunk: keysync_machine::node::FETCH_CHUNK,
            settle: parts.settle,
            observe: parts.settings.observe,
            guard: parts.settings.guard.clone(),
            tombstone_ttl: parts.settings.tombstone_ttl,
            masters: masters(&parts.settings.masters),
        };
        let mut effects = Effects {
            node: parts.settings.node,
            ahead: crate::disk::pki::ahead::ReadAhead::new(parts.pki.clone()),
            pki: parts.pki,
            store: parts.store,
            owner: parts.owner,
            cachedir: parts.settings.cachedir,
            master_id: parts.settings.master_id,
            audit: parts.audit,
            metrics: parts.metrics,
            outgoing,
            buffered: Vec::new(),
            observe: parts.settings.observe,
            prestaged: None,
        };
        let node = Node::start(settings, loaded, now(), &mut effects);
        effects.write_told();
        Ok(Core { node, effects, watch: parts.watch, held_exported: Default::default(), held_exported_at: None })
    }

    /// Starts the core on its own thread (see `thread.rs`) and runs it until
    /// `shutdown`. The start happens there, not on an async worker: the
    /// agent answers peers' TLS handshakes meanwhile, and what they ask
    /// waits in the core's queue. The receiver says when the start is done,
    /// or why it failed (the thread then ends at once).
    pub fn spawn(
        self,
        events: mpsc::UnboundedReceiver<WatchEvent>,
        requests: mpsc::Receiver<Request>,
        shutdown: CancellationToken,
        on_park: Option<fn()>,
    ) -> std::io::Result<(CoreThread, oneshot::Receiver<Result<(), StartError>>)> {
        let (started_tx, started) = oneshot::channel();
        let run = {
            let shutdown = shutdown.clone();
            async move {
                // The store is initialized once started: from here on its
                // loss is detected. Marked before anything a peer asked
                // meanwhile is carried out.
                let observe = self.parts.settings.observe;
                let started = self.start().and_then(|core| if observe { Ok(core) } else { core.mark().map(|()| core) });
                match started {
                    Ok(core) => {
                        let _ = started_tx.send(Ok(()));
                        core.run(events, requests, shutdown).await;
                    }
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                    }
                }
            }
        };
        Ok((thread::spawn(run, shutdown, on_park)?, started))
    }
}
