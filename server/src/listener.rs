//! The mTLS listener: accepts TCP, runs each TLS handshake in its own task, identifies the peer
//! and serves the KeySync service on the identified connections.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use keysync_proto::v1::key_sync_server::KeySyncServer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;
use tonic::transport::server::Connected;
use tonic::transport::Server;

use crate::control::ListenerControl;
use crate::events::{EventFn, EventSink, TransportEvent};
use crate::identity::{PeerInfo, PeerName};
use crate::refusals::RefusalAudit;
use crate::service::{Handler, KeySyncService};
use crate::tcp_probe::{Probed, TcpProbe};
use crate::tls::TlsSetup;
use crate::verifier::HandshakeRecord;

/// How long open connections may finish their calls once shutdown is requested: a peer's push
/// stream never ends by itself, and the agent is stopping anyway (its peers repair what a cut
/// call leaves by anti-entropy), so a stop does not wait on it.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(100);
/// How often the counts of refusals whose window ended are told.
const REFUSAL_FLUSH: Duration = Duration::from_secs(5);
/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// HTTP/2 pings that detect a vanished peer on an otherwise idle connection.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Listener settings.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Peer names admitted: a client must present a certificate with one of them as DNS SAN.
    pub allowed_peers: Vec<PeerName>,
    /// Largest gRPC message decoded or encoded, in bytes.
    pub max_message_bytes: usize,
    /// Longest a client may take to complete its TLS handshake.
    pub handshake_timeout: Duration,
    /// Handshakes in progress, per source and in all (beyond them a new connection is closed at
    /// once, so that idle connections cannot starve the peers).
    pub limits: crate::limits::ConnectionLimits,
    /// Refusals from one source address are reported once per window, then counted (zero:
    /// each one reported).
    pub refusal_window: Duration,
    /// Longest a peer may take to read a Diff or Fetch answer whole: then it is cut off and
    /// the answer's memory given back (`budget.rs`).
    pub answer_deadline: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            allowed_peers: Vec::new(),
            max_message_bytes: 8 * 1024 * 1024,
            handshake_timeout: Duration::from_secs(5),
            limits: crate::limits::ConnectionLimits::default(),
            refusal_window: crate::events::REFUSAL_WINDOW,
            answer_deadline: Duration::from_secs(120),
        }
    }
}

/// Why the listener stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("gRPC server failed")]
    Transport(#[source] tonic::transport::Error),
}

/// Serves the KeySync service on `listener` until `shutdown` is cancelled.
///
/// Each TLS handshake runs in its own task bounded by `opts.handshake_timeout`, so a slow or bad
/// client never blocks others. A client is admitted only with a certificate that chains to the
/// CA and carries a DNS SAN equal to one of `opts.allowed_peers`; that name is the [`PeerName`]
/// handed to every `handler` call. Refusals and connections are reported to `events`.
///
/// On shutdown the listener stops accepting, open connections get a short grace period to finish
/// their calls, then are closed; the function returns once they are.
///
/// [`PeerName`]: crate::PeerName
pub async fn serve<H: Handler>(
    listener: TcpListener,
    tls: &TlsSetup,
    opts: ServeOptions,
    handler: Arc<H>,
    events: EventFn,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let control = ListenerControl::new(tls.clone(), opts.allowed_peers.clone());
    serve_with(listener, control, opts, handler, events, shutdown).await
}

/// [`serve`] whose TLS material and admitted peers come from `control` (`opts.allowed_peers` is
/// not used), so that they can be changed while it runs: see [`ListenerControl::reload`].
pub async fn serve_with<H: Handler>(
    listener: TcpListener,
    control: ListenerControl,
    opts: ServeOptions,
    handler: Arc<H>,
    events: EventFn,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let events = EventSink::new(events, opts.refusal_window);
    // Stops accepting on shutdown, and also if the gRPC server fails on its own.
    let stop = shutdown.child_token();
    let (conn_tx, conn_rx) = mpsc::channel::<PeerIo>(16);
    let force_close = CancellationToken::new();
    let handshakes = TaskTracker::new();

    let service = KeySyncServer::new(KeySyncService::new(handler, events.clone(), opts.answer_deadline))
        .max_decoding_message_size(opts.max_message_bytes)
        .max_encoding_message_size(opts.max_message_bytes);
    let audit_events = events.clone();
    let server = Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .layer(tower::layer::layer_fn(move |inner| RefusalAudit::new(inner, audit_events.clone())))
        .add_service(service)
        .serve_with_incoming_shutdown(
            ReceiverStream::new(conn_rx).map(Ok::<_, Infallible>),
            shutdown.clone().cancelled_owned(),
        );

    let flushing = {
        let (events, stop) = (events.clone(), stop.clone());
        async move {
            let mut tick = tokio::time::interval(REFUSAL_FLUSH);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => events.flush_refusals(),
                }
            }
            events.flush_refusals();
        }
    };
    let accepting = accept_loop(
        listener,
        opts.limits,
        AcceptContext {
            control,
            handshake_timeout: opts.handshake_timeout,
            events,
            conn_tx,
            force_close: force_close.clone(),
            handshakes: handshakes.clone(),
            stop: stop.clone(),
        },
    );

    let serving = async {
        let mut server = pin!(server);
        let served = tokio::select! {
            served = &mut server => served,
            () = async { shutdown.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
                force_close.cancel();
                server.await
            }
        };
        stop.cancel();
        served
    };
    let (served, (), ()) = tokio::join!(serving, accepting, flushing);
    handshakes.close();
    handshakes.wait().await;
    served.map_err(ServeError::Transport)
}

/// Everything the accept loop and its handshake tasks share.
#[derive(Clone)]
struct AcceptContext {
    control: ListenerControl,
    handshake_timeout: Duration,
    events: EventSink,
    conn_tx: mpsc::Sender<PeerIo>,
    force_close: CancellationToken,
    handshakes: TaskTracker,
    stop: CancellationToken,
}

async fn accept_loop(listener: TcpListener, limits: crate::limits::ConnectionLimits, ctx: AcceptContext) {
    let gate = crate::limits::Gate::new(limits);
    loop {
        let accepted = tokio::select! {
            () = ctx.stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((tcp, remote)) => match gate.admit(remote.ip(), ctx.control.is_peer_source(remote.ip())) {
                Ok(place) => {
                    let ctx = ctx.clone();
                    ctx.handshakes.clone().spawn(async move {
                        tokio::select! {
                            () = handshake(ctx.clone(), tcp, remote) => {}
                            // A newer handshake from a peer's address took its place.
                            () = place.evicted.cancelled() => ctx.events.emit(TransportEvent::HandshakeRefused {
                                remote,
                                presented: Vec::new(),
                                reason: "ended for a newer handshake from this peer's address".into(),
                            }),
                        }
                        drop(place);
                    });
                }
                // Closed at once (dropped): a flood holds no descriptor.
                Err(reason) => {
                    drop(tcp);
                    ctx.events.emit(TransportEvent::HandshakeRefused { remote, presented: Vec::new(), reason })
                }
            },
            Err(error) => {
                tracing::warn!(%error, "accepting a TCP connection failed");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
}

/// Runs one TLS handshake and, if the peer is admitted, hands the connection to the server.
async fn handshake(ctx: AcceptContext, tcp: TcpStream, remote: SocketAddr) {
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::debug!(%remote, %error, "setting TCP_NODELAY failed");
    }
    let record = HandshakeRecord::new();
    // Taken once: a reload during this handshake applies to the next one.
    let current = ctx.control.current();
    let config = match current.tls.server_config(current.allowed_peers.clone(), record.clone()) {
        Ok(config) => config,
        Err(error) => {
            tracing::error!(%remote, %error, "building the TLS server configuration failed");
            return;
        }
    };
    let probe = TcpProbe::default();
    let accepting = tokio::time::timeout(ctx.handshake_timeout, TlsAcceptor::from(config).accept(probe.watch(tcp)));
    let outcome = tokio::select! {
        () = ctx.stop.cancelled() => return,
        outcome = accepting => outcome,
    };
    let recorded = record.snapshot();
    let refusal = match outcome {
        Ok(Ok(stream)) => match recorded.peer {
            Some(peer) => {
                let close = ctx.force_close.child_token();
                if !ctx.control.register(peer.clone(), close.clone(), probe) {
                    ctx.events.emit(TransportEvent::RequestRefused {
                        peer: peer.clone(),
                        reason: format!(
                            "connection from {remote} closed: {} connections of this peer are open already",
                            crate::control::CONNECTIONS_PER_PEER
                        ),
                    });
                    return;
                }
                ctx.events.emit(TransportEvent::Connected { remote, peer: peer.clone() });
                let io = PeerIo::new(stream, PeerInfo { peer }, close);
                // A closed channel means the server is shutting down: the connection just drops.
                let _ = ctx.conn_tx.send(io).await;
                return;
            }
            // The verifier admitted the certificate without naming it: cannot happen, refuse.
            None => "handshake completed without an identified client certificate".to_owned(),
        },
        Ok(Err(error)) => crate::io_error_words(&error),
        Err(_elapsed) => format!("TLS handshake not completed within {:?}", ctx.handshake_timeout),
    };
    let event = if recorded.unknown_peer {
        TransportEvent::UnknownPeer { remote, presented: recorded.presented }
    } else {
        TransportEvent::HandshakeRefused { remote, presented: recorded.presented, reason: refusal }
    };
    ctx.events.emit(event);
}

/// An identified TLS connection, as tonic sees it: it carries the peer's identity into every
/// request, and fails its IO once `force_close` fires (a child of the listener's, cancelled at
/// shutdown, or alone by a reload that no longer admits this peer) so nothing hangs on a peer.
struct PeerIo {
    stream: TlsStream<Probed>,
    info: PeerInfo,
    force_close: CancellationToken,
    force_close_wait: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl PeerIo {
    fn new(stream: TlsStream<Probed>, info: PeerInfo, force_close: CancellationToken) -> Self {
        Self { stream, info, force_close_wait: Box::pin(force_close.clone().cancelled_owned()), force_close }
    }

    /// Whether shutdown has closed this connection; registers the waker otherwise.
    fn closed(&mut self, cx: &mut Context<'_>) -> bool {
        // Checked first so that the wait future is never polled after it completed.
        self.force_close.is_cancelled() || self.force_close_wait.as_mut().poll(cx).is_ready()
    }
}

impl Drop for PeerIo {
    // Marks the connection finished, so that the control forgets it.
    fn drop(&mut self) {
        self.force_close.cancel();
    }
}

fn closed_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "listener shut down")
}

impl Connected for PeerIo {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for PeerIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for PeerIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.force_close.is_cancelled() {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.force_close.is_cancelled() {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
