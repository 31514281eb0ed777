//! Outgoing connections: a mutually authenticated TLS 1.3 channel to one peer, as a KeySync client.

use std::io;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use keysync_proto::v1::key_sync_client::KeySyncClient;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::tcp_probe::{Probed, TcpProbe};
use crate::tls::TlsSetup;

/// HTTP/2 pings that detect a vanished peer, also while no call is running.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a connection to a peer could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("peer name {name:?} is not a valid DNS name")]
    InvalidPeerName { name: String },
    #[error("peer address {address:?} is not host:port")]
    InvalidAddress {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("connecting to peer {peer} at {address}")]
    Transport {
        peer: String,
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("connecting to peer {peer} at {address} timed out after {timeout:?}")]
    Timeout { peer: String, address: String, timeout: Duration },
}

impl ConnectError {
    /// The TLS error behind this failure when the handshake itself refused the peer (for example
    /// its certificate names another server, or chains to another CA), in words, with
    /// the names the peer presented. `None` for plain network failures (refused, timed out), and
    /// when it was the peer that refused us (an alert it sent: [`alert_received`]).
    pub fn tls_refusal(&self) -> Option<String> {
        tls_refusal(self)
    }
}

/// The errors of `error`'s chain, each io::Error's wrapped error included
/// (io::Error::source skips the error it wraps).
fn chain<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |error| error.source()).flat_map(|error| {
        let inner = error.downcast_ref::<io::Error>().and_then(io::Error::get_ref);
        std::iter::once(error).chain(inner.map(|inner| inner as &(dyn std::error::Error + 'static)))
    })
}

/// What this side's TLS refused in `error`'s chain (the peer's certificate:
/// another name, another CA, expired), in words; not an alert the peer sent.
pub fn tls_refusal(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    chain(error)
        .filter_map(|error| error.downcast_ref::<rustls::Error>())
        .find(|tls| !matches!(tls, rustls::Error::AlertReceived(_)))
        .map(crate::tls_error_words)
}

/// The TLS alert the peer ended the connection with, if `error` is one: its
/// name in words ("access denied", "unknown CA", "certificate expired"). The
/// alert's refusal of our certificate reaches the first call (TLS 1.3
/// finishes the client side first), where it may be only text by then.
pub fn alert_received(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    const RECEIVED: &str = "received fatal alert: ";
    chain(error).find_map(|error| {
        if let Some(rustls::Error::AlertReceived(alert)) = error.downcast_ref::<rustls::Error>() {
            return Some(crate::words::words(&format!("{alert:?}")));
        }
        let text = error.to_string();
        let name = &text[text.find(RECEIVED)? + RECEIVED.len()..];
        let name = &name[..name.find(|c: char| !c.is_ascii_alphanumeric()).unwrap_or(name.len())];
        (!name.is_empty()).then(|| crate::words::words(name))
    })
}

/// Opens a mutually authenticated TLS 1.3 connection to `address` (`host:port`), verifying that
/// the server's certificate chains to our CA and carries the DNS SAN `peer_name`, and returns a
/// KeySync client on it whose messages are capped at `max_message_bytes` both ways.
///
/// The connection is eager: TCP, TLS and the HTTP/2 preface happen here, within `timeout`, so a
/// wrong server name or certificate is an error from this function. Because TLS 1.3 finishes
/// the client side first, the server's refusal of *our* certificate shows on the first call.
/// If the connection drops later, the channel reconnects on the next call (same checks).
pub async fn connect(
    address: &str,
    peer_name: &str,
    tls: &TlsSetup,
    max_message_bytes: usize,
    timeout: Duration,
) -> Result<KeySyncClient<Channel>, ConnectError> {
    let probe = TcpProbe::default();
    connect_with(address, peer_name, tls, max_message_bytes, timeout, Redial::Yes, probe).await
}

/// [`connect`], but a connection that drops is not made again: every call
/// after fails. An agent's link holds two connections to a peer and ends
/// its session when either is found lost (at its next use: the pushes'
/// one is read all the time, the rounds' one at the next round), so that
/// the next session connects with the TLS material of then, as every
/// connection attempt must. Returned with a probe of its TCP connection.
pub async fn connect_once(
    address: &str,
    peer_name: &str,
    tls: &TlsSetup,
    max_message_bytes: usize,
    timeout: Duration,
) -> Result<(KeySyncClient<Channel>, TcpProbe), ConnectError> {
    let probe = TcpProbe::default();
    let client = connect_with(address, peer_name, tls, max_message_bytes, timeout, Redial::No, probe.clone()).await?;
    Ok((client, probe))
}

/// Whether a channel whose connection dropped connects again.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Redial {
    Yes,
    No,
}

async fn connect_with(
    address: &str,
    peer_name: &str,
    tls: &TlsSetup,
    max_message_bytes: usize,
    timeout: Duration,
    redial: Redial,
    probe: TcpProbe,
) -> Result<KeySyncClient<Channel>, ConnectError> {
    let server_name = match ServerName::try_from(peer_name.to_owned()) {
        Ok(name @ ServerName::DnsName(_)) => name,
        _ => return Err(ConnectError::InvalidPeerName { name: peer_name.to_owned() }),
    };
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .map_err(|source| ConnectError::InvalidAddress { address: address.to_owned(), source })?
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);

    let connector = TlsConnector::from(tls.client_config());
    let target = address.to_owned();
    let dialed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let connect_one = tower::service_fn(move |_: Uri| {
        let (connector, server_name, target) = (connector.clone(), server_name.clone(), target.clone());
        let probe = probe.clone();
        let again = dialed.swap(true, std::sync::atomic::Ordering::SeqCst);
        async move {
            if again && redial == Redial::No {
                return Err(io::Error::new(io::ErrorKind::NotConnected, "the connection was lost (not made again)"));
            }
            tokio::time::timeout(timeout, open_tls(&target, server_name, connector, &probe))
                .await
                .unwrap_or_else(|_| {
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("TCP and TLS handshake not completed within {timeout:?}"),
                    ))
                })
                .map(TokioIo::new)
        }
    });

    let channel = tokio::time::timeout(timeout, endpoint.connect_with_connector(connect_one))
        .await
        .map_err(|_| ConnectError::Timeout { peer: peer_name.to_owned(), address: address.to_owned(), timeout })?
        .map_err(|source| ConnectError::Transport {
            peer: peer_name.to_owned(),
            address: address.to_owned(),
            source,
        })?;
    Ok(KeySyncClient::new(channel)
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes))
}

/// One TCP connection and TLS handshake to `address`, expecting `server_name`.
async fn open_tls(
    address: &str,
    server_name: ServerName<'static>,
    connector: TlsConnector,
    probe: &TcpProbe,
) -> io::Result<TlsStream<Probed>> {
    let tcp = TcpStream::connect(address).await?;
    tcp.set_nodelay(true)?;
    connector.connect(server_name, probe.watch(tcp)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alerts_are_named_in_words_also_when_only_text_is_left() {
        let typed = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA),
        );
        assert_eq!(alert_received(&typed).as_deref(), Some("unknown CA"));
        let text = io::Error::new(io::ErrorKind::InvalidData, "received fatal alert: AccessDenied");
        assert_eq!(alert_received(&text).as_deref(), Some("access denied"));
        assert_eq!(tls_refusal(&text), None);
        let ours = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::Expired),
        );
        assert_eq!(alert_received(&ours), None);
        assert_eq!(tls_refusal(&ours).as_deref(), Some("certificate expired"));
        assert_eq!(alert_received(&io::Error::from(io::ErrorKind::ConnectionRefused)), None);
    }
}
