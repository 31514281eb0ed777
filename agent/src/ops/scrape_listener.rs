//! The `/metrics` endpoint's listener, bounded: at most a few connections
//! at once (further ones are closed as they come) and each closed after a
//! deadline, so that idle connections can neither pile up until the agent
//! runs out of file descriptors (a key change was once refused with "Too
//! many open files") nor hold a place for ever.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Scrapes served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Longest a scrape connection stays open.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(15);

pub struct ScrapeListener {
    inner: TcpListener,
    places: Arc<Semaphore>,
    deadline: Duration,
}

impl ScrapeListener {
    /// At most `max` connections at once, each open at most `deadline`.
    pub fn new(inner: TcpListener, max: usize, deadline: Duration) -> ScrapeListener {
        ScrapeListener { inner, places: Arc::new(Semaphore::new(max)), deadline }
    }
}

impl axum::serve::Listener for ScrapeListener {
    type Io = Bounded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (tcp, remote) = match self.inner.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a metrics connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(place) = self.places.clone().try_acquire_owned() else {
                // Full: closed at once, holding nothing.
                continue;
            };
            // Small responses: without NODELAY a scrape can wait on a delayed ACK.
            let _ = tcp.set_nodelay(true);
            let deadline = Box::pin(tokio::time::sleep(self.deadline));
            return (Bounded { tcp, deadline, _place: place }, remote);
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A scrape connection: fails once its deadline has passed, and gives its
/// place back when dropped.
pub struct Bounded {
    tcp: TcpStream,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _place: OwnedSemaphorePermit,
}

impl Bounded {
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

fn expired_error() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "metrics connection open too long")
}

impl AsyncRead for Bounded {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.expired(cx) {
            return Poll::Ready(Err(expired_error()));
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.expired(cx) {
            return Poll::Ready(Err(expired_error()));
        }
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Issue 14 item 4: idle connections to /metrics are closed at their
    /// deadline, beyond the cap they are closed at once, and a scrape still
    /// gets through.
    #[tokio::test]
    async fn idle_connections_are_capped_and_closed_and_scrapes_still_work() {
        const MAX: usize = 4;
        const DEADLINE: Duration = Duration::from_millis(500);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let metrics = Arc::new(super::super::metrics::Metrics::new("master-a"));
        let shutdown = tokio_util::sync::CancellationToken::new();
        let bounded = ScrapeListener::new(listener, MAX, DEADLINE);
        tokio::spawn(super::super::metrics::serve_on(bounded, metrics, shutdown.clone()));
        let mut idle = Vec::new();
        for _ in 0..MAX {
            idle.push(TcpStream::connect(address).await.unwrap());
        }
        // Over the cap: closed at once (EOF on read).
        let mut extra = TcpStream::connect(address).await.unwrap();
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(30), extra.read(&mut byte)).await;
        assert_eq!(closed.expect("closed at once").unwrap_or(0), 0);
        // At the deadline the idle ones are closed (EOF or reset), and places come back.
        for mut stream in idle {
            let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut byte)).await;
            assert_eq!(n.expect("closed at its deadline").unwrap_or(0), 0, "an idle connection got bytes");
        }
        let mut scrape = TcpStream::connect(address).await.unwrap();
        scrape.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        scrape.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("keysync_"), "{answer}");
        shutdown.cancel();
    }
}
