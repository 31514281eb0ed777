//! Transport events worth auditing, logged here once and handed to the caller's sink.

use std::net::SocketAddr;
use std::sync::Arc;

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
}

/// The caller's event callback.
pub type EventFn = Arc<dyn Fn(TransportEvent) + Send + Sync>;

/// Logs every event with structured fields, then passes it on.
#[derive(Clone)]
pub(crate) struct EventSink {
    callback: EventFn,
}

impl EventSink {
    pub(crate) fn new(callback: EventFn) -> Self {
        Self { callback }
    }

    pub(crate) fn emit(&self, event: TransportEvent) {
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
        }
        (self.callback)(event);
    }
}
