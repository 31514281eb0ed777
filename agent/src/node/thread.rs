//! The core's own thread. Carrying out the machine's effects blocks: key
//! file writes, `syncfs`, redb commits, audit writes. On one of the
//! runtime's two async workers, that kept waiting whatever else was queued
//! there — gRPC answers to peers, the links, the control socket — for as
//! long as a batch took. The core runs on an OS thread of its own instead,
//! with a current-thread runtime for its select loop (its channels, its
//! timer and the shutdown token work across runtimes); the rest of the agent
//! reaches it through [`super::CoreHandle`] exactly as before.

use std::future::Future;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// The thread's name, as `top -H` and a panic's message show it.
const THREAD_NAME: &str = "keysync-core";

/// Why the core stopped while the agent was not stopping.
#[derive(Debug, thiserror::Error)]
pub enum CoreStopped {
    #[error("the core panicked: {0}")]
    Panicked(String),
    /// Its folder events or its requests ended (the watcher or every handle gone).
    #[error("the core stopped: its inputs ended")]
    InputsEnded,
}

/// The core running on its own thread.
pub struct CoreThread {
    stopped: oneshot::Receiver<Result<(), String>>,
    shutdown: CancellationToken,
}

impl CoreThread {
    /// Waits until the core has stopped (after its final audit flush):
    /// `Ok` once it stopped for `shutdown`, else why it stopped.
    pub async fn stopped(self) -> Result<(), CoreStopped> {
        match self.stopped.await {
            Ok(Ok(())) if self.shutdown.is_cancelled() => Ok(()),
            Ok(Ok(())) => Err(CoreStopped::InputsEnded),
            Ok(Err(panic)) => Err(CoreStopped::Panicked(panic)),
            // The thread ended without a word: it cannot unwind past the send.
            Err(_) => Err(CoreStopped::Panicked("the core's thread ended without an answer".into())),
        }
    }
}

/// Runs `run` on a thread of its own under a current-thread runtime;
/// `on_park` is called whenever that runtime waits (see
/// [`crate::agent::RunOptions::on_thread_park`]). Returns once the thread
/// has its runtime.
pub(super) fn spawn<F>(run: F, shutdown: CancellationToken, on_park: Option<fn()>) -> std::io::Result<CoreThread>
where
    F: Future<Output = ()> + Send + 'static,
{
    let (started_tx, started) = std::sync::mpsc::sync_channel(1);
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new().name(THREAD_NAME.into()).spawn(move || {
        // Made and dropped on this thread: a runtime may not be dropped on
        // an async worker, where `spawn` is called.
        let mut builder = tokio::runtime::Builder::new_current_thread();
        builder.enable_time();
        if let Some(on_park) = on_park {
            builder.on_thread_park(on_park);
        }
        let runtime = match builder.build() {
            Ok(runtime) => runtime,
            Err(e) => {
                let _ = started_tx.send(Err(e));
                return;
            }
        };
        let _ = started_tx.send(Ok(()));
        // A panic is printed by the panic hook as on any thread; the agent
        // learns of it from the answer.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            runtime.block_on(run);
            // The core's timers and whatever it holds go before the answer.
            drop(runtime);
        }));
        let _ = tx.send(outcome.map_err(|panic| panic_message(panic.as_ref())));
    })?;
    // A thread that ended without a word could not unwind past the send.
    started.recv().unwrap_or_else(|_| Err(std::io::Error::other("the core's thread ended at its start")))?;
    Ok(CoreThread { stopped: rx, shutdown })
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(message), _) => (*message).to_string(),
        (None, Some(message)) => message.clone(),
        (None, None) => "(no message)".into(),
    }
}
