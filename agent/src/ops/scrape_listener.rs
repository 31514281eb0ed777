//! The `/metrics` endpoint's listener, bounded: at most a few connections
//! at once, at most [`PER_SOURCE`] from one address, and only from the
//! scrapers' addresses when `metrics_allow` lists them (further ones are
//! closed as they come); a connection must send its request within
//! [`REQUEST_DEADLINE`] and is closed after [`CONNECTION_DEADLINE`] in any
//! case. Idle connections can neither pile up until the agent runs out of
//! file descriptors (a key change was once refused with "Too many open
//! files") nor hold a place for long: sixteen of them once blinded every
//! scrape, and with it the alert on held deletes.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Scrapes served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Connections from one address at once.
pub const PER_SOURCE: usize = 2;
/// Longest a scrape connection stays open.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(15);
/// Longest a connection may wait before it sends its first byte.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);

/// How the listener bounds its connections.
#[derive(Clone, Debug)]
pub struct Bounds {
    pub max: usize,
    pub per_source: usize,
    pub request_deadline: Duration,
    pub deadline: Duration,
    /// Only these addresses are served (empty: any).
    pub allow: Vec<IpAddr>,
}

impl Bounds {
    /// The defaults, serving the addresses in `allow` (empty: any).
    pub fn with_allow(allow: Vec<IpAddr>) -> Bounds {
        Bounds {
            max: MAX_CONNECTIONS,
            per_source: PER_SOURCE,
            request_deadline: REQUEST_DEADLINE,
            deadline: CONNECTION_DEADLINE,
            allow,
        }
    }
}

pub struct ScrapeListener {
    inner: TcpListener,
    places: Arc<Semaphore>,
    /// Connections open per source address.
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
    bounds: Bounds,
}

impl ScrapeListener {
    pub fn new(inner: TcpListener, bounds: Bounds) -> ScrapeListener {
        let places = Arc::new(Semaphore::new(bounds.max));
        ScrapeListener { inner, places, sources: Arc::default(), bounds }
    }

    /// A place for one more connection from `source`, if it may have one.
    fn admit(&self, source: IpAddr) -> Option<Place> {
        if !self.bounds.allow.is_empty() && !self.bounds.allow.contains(&source) {
            return None;
        }
        let mut sources = self.sources.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let open = sources.entry(source).or_insert(0);
        if *open >= self.bounds.per_source {
            return None;
        }
        let place = self.places.clone().try_acquire_owned().ok()?;
        *open += 1;
        Some(Place { _place: place, source, sources: self.sources.clone() })
    }
}

/// A connection's place: given back (in all and for its source) when dropped.
pub struct Place {
    _place: OwnedSemaphorePermit,
    source: IpAddr,
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut sources = self.sources.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(open) = sources.get_mut(&self.source) {
            *open -= 1;
            if *open == 0 {
                sources.remove(&self.source);
            }
        }
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
            let Some(place) = self.admit(remote.ip()) else {
                // Not a scraper, or full: closed at once, holding nothing.
                continue;
            };
            // Small responses: without NODELAY a scrape can wait on a delayed ACK.
            let _ = tcp.set_nodelay(true);
            let deadline = Box::pin(tokio::time::sleep(self.bounds.deadline));
            let request_deadline = Some(Box::pin(tokio::time::sleep(self.bounds.request_deadline)));
            return (Bounded { tcp, deadline, request_deadline, _place: place }, remote);
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A scrape connection: fails once its deadline has passed (or its request
/// deadline, before it sent anything), and gives its place back when dropped.
pub struct Bounded {
    tcp: TcpStream,
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// Until the first byte comes.
    request_deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    _place: Place,
}

impl Bounded {
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
            || self.request_deadline.as_mut().is_some_and(|request| request.as_mut().poll(cx).is_ready())
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
        let before = buf.filled().len();
        let read = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.request_deadline = None;
        }
        read
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
        let bounds = Bounds { max: MAX, per_source: MAX, deadline: DEADLINE, ..Bounds::with_allow(Vec::new()) };
        let bounded = ScrapeListener::new(listener, bounds);
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

    async fn scrape(address: SocketAddr, from: IpAddr) -> Option<String> {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(from, 0)).unwrap();
        let mut scrape = socket.connect(address).await.ok()?;
        scrape.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.ok()?;
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(30), scrape.read_to_string(&mut answer)).await.ok()?.ok()?;
        answer.starts_with("HTTP/1.1 200").then_some(answer)
    }

    async fn idle_from(address: SocketAddr, from: IpAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(from, 0)).unwrap();
        socket.connect(address).await.unwrap()
    }

    /// Issue 27 item 7: sixteen idle connections blinded every scrape (and
    /// the held-deletes alert with it). Now one address holds two places at
    /// most, a connection that sends nothing is closed after the request
    /// deadline, and with `metrics_allow` only the scrapers are served.
    #[tokio::test]
    async fn idle_connections_from_others_never_blind_the_scraper() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let metrics = Arc::new(super::super::metrics::Metrics::new("master-a"));
        let shutdown = tokio_util::sync::CancellationToken::new();
        let bounds = Bounds { request_deadline: Duration::from_millis(300), ..Bounds::with_allow(Vec::new()) };
        tokio::spawn(super::super::metrics::serve_on(ScrapeListener::new(listener, bounds), metrics, shutdown.clone()));
        let local: IpAddr = "127.0.0.2".parse().unwrap();
        let scraper: IpAddr = "127.0.0.1".parse().unwrap();
        // 300 idle connections from one address: two hold a place.
        let mut idle = Vec::new();
        for _ in 0..300 {
            idle.push(idle_from(address, local).await);
        }
        assert!(scrape(address, scraper).await.is_some(), "served while one address holds 300");
        // Sixteen addresses holding every place: freed at the request deadline.
        for i in 0..16 {
            idle.push(idle_from(address, format!("127.0.1.{i}").parse().unwrap()).await);
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(scrape(address, scraper).await.is_some(), "served once the idle ones sent nothing in time");
        shutdown.cancel();

        // With an allow-list, nobody else holds a place at all.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let metrics = Arc::new(super::super::metrics::Metrics::new("master-a"));
        let shutdown = tokio_util::sync::CancellationToken::new();
        let bounds = Bounds::with_allow(vec![scraper]);
        tokio::spawn(super::super::metrics::serve_on(ScrapeListener::new(listener, bounds), metrics, shutdown.clone()));
        for i in 0..40 {
            idle.push(idle_from(address, format!("127.0.2.{i}").parse().unwrap()).await);
        }
        assert!(scrape(address, scraper).await.is_some(), "the scraper is served");
        assert!(scrape(address, local).await.is_none(), "others are closed at once");
        shutdown.cancel();
    }
}
