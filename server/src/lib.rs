//! Transport of salt-keysync: the KeySync gRPC service on a mutual-TLS 1.3 listener, the client
//! connector for peers, and a certificate helper.
//!
//! Architecture invariant: this crate never touches the filesystem (it takes PEM bytes, not
//! paths) and knows nothing of Salt; it authenticates peers and moves protobuf messages.
//!
//! - [`tls`]: PEM material to rustls configurations.
//! - [`serve`]: the listener; per-connection handshakes, peer identification, audit events,
//!   and the budgets that bound what peers' pushes take (`budget.rs`).
//!   [`serve_with`] and [`ListenerControl`] change its TLS material and peers while it runs.
//! - [`connect`]: an authenticated client channel to one peer; [`probe`]: whether a peer can
//!   be reached and accepts this node, each step told apart (for `salt-keysync check`);
//!   [`TcpProbe`]: what TCP sent, and sent again, on a peer's connection.
//! - [`certgen`]: a small CA for sites without a PKI, and for tests.
//! - [`tls_error_words`]: rustls's errors in words (its own `Display` names enum variants).

// Unsafe only in `tcp_probe.rs` (a getsockopt), which allows it for itself.
#![deny(unsafe_code)]

mod budget;
pub mod certgen;
mod client;
mod control;
mod events;
mod identity;
mod limits;
mod listener;
mod probe;
mod refusals;
mod service;
mod tcp_probe;
pub mod tls;
mod verifier;
mod words;

pub use budget::{ANSWERS_PER_PEER, CALLS_IN_ALL, CALLS_PER_PEER, PUSH_STREAMS_PER_PEER};
pub use certgen::{CertAuthority, CertError, IssuedCert};
pub use client::{alert_received, connect, connect_once, tls_refusal, ConnectError};
pub use control::{ListenerControl, CONNECTIONS_PER_PEER};
pub use events::{EventFn, TransportEvent};
pub use identity::PeerName;
pub use limits::ConnectionLimits;
pub use listener::{serve, serve_with, ServeError, ServeOptions};
pub use probe::{probe, ProbeError, Stage};
pub use service::{Handler, Items};
pub use tcp_probe::{Sent, TcpProbe, RESENT_ONE_IN};
pub use tls::{PemInput, TlsError, TlsMaterial, TlsSetup};
pub use words::{certificate_error_words, error_words, io_error_words, tls_error_words};
