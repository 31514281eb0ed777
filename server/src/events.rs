//! Transport events worth auditing, logged here once and handed to the caller's sink.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::limits::RefusalCounter;

use crate::identity::PeerName;

/// Something worth auditing that happened at the transport level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportEvent {
    /// The TLS handshake failed (no client certificate, unknown CA, expired, not TLS 1.3,
    /// garbage, timeout...). `presented`: the DNS SANs (or `CN=` subject names) of the client
    /// certificate if one was presented and parseable, else empty.
    HandshakeRefused { remote: SocketAddr, presented: Vec<String>, reason: String },
    /// The client certificate chains to our CA but no DNS SAN equals an allowed peer name: the
    /// handshake was refused with an `access_denied` alert.
    UnknownPeer { remote: SocketAddr, presented: Vec<String> },
    /// A request refused after the handshake (Hello's node is not the certificate's peer name,
    /// wrong protocol version, oversized or malformed message, unknown method...).
    RequestRefused { peer: PeerName, reason: String },
    /// A peer completed the handshake and was identified.
    Connected { remote: SocketAddr, peer: PeerName },
    /// More refusals from one source address after the first one of a
    /// window, which alone was told: how many, and the last reason.
    RefusedAgain { source: IpAddr, presented: Vec<String>, count: u64, window: Duration, last_reason: String },
}

/// The caller's event callback.
pub type EventFn = Arc<dyn Fn(TransportEvent) + Send + Sync>;

/// How long refusals from one source are counted before a summary (the default).
pub(crate) const REFUSAL_WINDOW: Duration = Duration::from_secs(60);

/// Logs every event with structured fields, then passes it on; refusals
/// only once per source per [`REFUSAL_WINDOW`], then a count.
#[derive(Clone)]
pub(crate) struct EventSink {
    callback: EventFn,
    refusals: Arc<Mutex<RefusalCounter>>,
}

impl EventSink {
    pub(crate) fn new(callback: EventFn, refusal_window: Duration) -> Self {
        Self { callback, refusals: Arc::new(Mutex::new(RefusalCounter::new(refusal_window))) }
    }

    /// Tells the counts of refusal windows that ended.
    pub(crate) fn flush_refusals(&self) {
        let due = self.refusals.lock().unwrap_or_else(std::sync::PoisonError::into_inner).due(Instant::now());
        for repeated in due {
            self.emit(TransportEvent::RefusedAgain {
                source: repeated.source,
                presented: repeated.presented.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect(),
                count: repeated.count,
                window: repeated.window,
                last_reason: repeated.last_reason,
            });
        }
    }

    pub(crate) fn emit(&self, event: TransportEvent) {
        let refused = match &event {
            TransportEvent::HandshakeRefused { remote, presented, reason } => {
                Some((remote.ip(), presented, reason.as_str()))
            }
            TransportEvent::UnknownPeer { remote, presented } => {
                Some((remote.ip(), presented, "names no configured peer"))
            }
            _ => None,
        };
        if let Some((source, presented, reason)) = refused {
            let mut refusals = self.refusals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if !refusals.note(source, &presented.join(","), reason, Instant::now()) {
                return;
            }
        }
        match &event {
            TransportEvent::HandshakeRefused { remote, presented, reason } => {
                tracing::warn!(%remote, ?presented, %reason, "TLS handshake refused")
            }
            TransportEvent::UnknownPeer { remote, presented } => {
                tracing::warn!(%remote, ?presented, "certificate names no configured peer")
            }
            TransportEvent::RequestRefused { peer, reason } => {
                tracing::warn!(peer = %peer, %reason, "request refused")
            }
            TransportEvent::Connected { remote, peer } => {
                tracing::info!(peer = %peer, %remote, "peer connected")
            }
            TransportEvent::RefusedAgain { source, presented, count, window, last_reason } => {
                tracing::warn!(%source, ?presented, count, ?window, %last_reason, "more connections refused from this address")
            }
        }
        (self.callback)(event);
    }
}
