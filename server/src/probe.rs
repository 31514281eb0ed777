//! `salt-keysync check`'s look at one peer: does its name resolve, does TCP
//! connect, does the TLS handshake succeed both ways (its certificate
//! carries the configured name and chains to our CA; it accepts ours), and
//! does its gRPC server answer. Nothing is called: the peer's HTTP/2 server
//! sends its SETTINGS frame to a client that sent the connection preface,
//! which it does only once it has accepted our certificate (TLS 1.3 finishes
//! the client side first, so the handshake alone cannot tell).

use std::fmt;
use std::io;
use std::net::SocketAddr;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::tls::TlsSetup;

/// The HTTP/2 client connection preface and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Where a probe stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The host name did not resolve.
    Resolve,
    /// No TCP connection (refused, unreachable).
    Connect,
    /// The TLS handshake failed: this side refused the peer's certificate, or
    /// the peer ended it with an alert.
    Handshake,
    /// After the handshake the peer ended the connection instead of answering
    /// (an alert refusing our certificate, or no gRPC server there).
    Answer,
}

/// Why a probe failed: where, at which address, and the cause (which may
/// wrap the TLS error: see [`crate::alert_received`], [`crate::tls_refusal`]).
#[derive(Debug)]
pub struct ProbeError {
    pub stage: Stage,
    pub addr: Option<SocketAddr>,
    pub cause: io::Error,
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.stage {
            Stage::Resolve => "the name does not resolve",
            Stage::Connect => "cannot connect",
            Stage::Handshake => "TLS handshake failed",
            Stage::Answer => "no answer after the TLS handshake",
        };
        // The cause is in the message, not a source(): `{:#}` would print it twice.
        write!(f, "{what}: {}", crate::io_error_words(&self.cause))
    }
}

impl std::error::Error for ProbeError {}

/// Probes the peer `peer_name` at `address` (`host:port`); the address that
/// answered. Unbounded in time: the caller sets the limit.
pub async fn probe(address: &str, peer_name: &str, tls: &TlsSetup) -> Result<SocketAddr, ProbeError> {
    let failed = |stage, addr, cause| ProbeError { stage, addr, cause };
    let server_name = match ServerName::try_from(peer_name.to_owned()) {
        Ok(name @ ServerName::DnsName(_)) => name,
        _ => {
            let cause = io::Error::new(io::ErrorKind::InvalidInput, format!("{peer_name:?} is not a DNS name"));
            return Err(failed(Stage::Handshake, None, cause));
        }
    };
    let addrs: Vec<SocketAddr> =
        tokio::net::lookup_host(address).await.map_err(|cause| failed(Stage::Resolve, None, cause))?.collect();
    let mut last = failed(Stage::Resolve, None, io::Error::new(io::ErrorKind::NotFound, "no address"));
    for addr in addrs {
        let tcp = match TcpStream::connect(addr).await {
            Ok(tcp) => tcp,
            Err(cause) => {
                last = failed(Stage::Connect, Some(addr), cause);
                continue;
            }
        };
        let connector = TlsConnector::from(tls.client_config());
        let mut stream = connector
            .connect(server_name.clone(), tcp)
            .await
            .map_err(|cause| failed(Stage::Handshake, Some(addr), cause))?;
        // A refusal may break the write (the peer closed) before the alert
        // is read: the read tells why.
        let wrote = async {
            stream.write_all(PREFACE).await?;
            stream.flush().await
        }
        .await;
        let mut answer = [0u8; 9];
        return match stream.read(&mut answer).await {
            Ok(n) if n > 0 => Ok(addr),
            Ok(_) => Err(failed(
                Stage::Answer,
                Some(addr),
                wrote.err().unwrap_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed")),
            )),
            Err(cause) => Err(failed(Stage::Answer, Some(addr), cause)),
        };
    }
    Err(last)
}
