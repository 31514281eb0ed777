//! What TCP knows of a peer's connection's sent segments: how many it
//! sent, and how many it had to send again (`TCP_INFO`), and so whether the
//! path loses packets. An agent's link reads its own two connections'
//! probes and those of the peer's connections to this listener (which
//! carry this side's answers the same way), and where the path loses
//! packets it sends a second copy of each live push on its other
//! connection: a push lost on the way would wait for TCP's recovery (a
//! tail-loss probe or a timeout, two round trips or more).
//!
//! The only unsafe code of this crate: `getsockopt` on the connection's
//! descriptor, which is read under the lock its stream takes to close it.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// One connection's data segments sent since it was opened, and those sent
/// again because they were lost: retransmissions the peer has acknowledged,
/// less those it reported as duplicates (D-SACK: a tail-loss probe or a
/// timeout that fired although nothing was lost, which a clean 10 ms path
/// shows now and then).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    pub segments: u32,
    pub retransmitted: u32,
    /// Segments sent again and not acknowledged yet: not counted in
    /// `retransmitted` until they are (they may turn out duplicates).
    pub resending: u32,
}

/// The path loses packets when TCP resent at least 1 in this many of a
/// connection's recent segments: a push is one or two segments, so then
/// about a percent of pushes or more would wait for TCP's recovery.
pub const RESENT_ONE_IN: u32 = 200;
/// A connection's recent segments: from this many to twice as many of the
/// last it sent, so a loss long past stops counting.
const WINDOW: u32 = 2000;

/// A look at one TCP connection of a peer's, while it is open; after a
/// redial ([`crate::connect`]), at the new one.
#[derive(Clone, Debug, Default)]
pub struct TcpProbe {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// The open connection's descriptor; `None` once its stream is dropped
    /// (set under this lock before the descriptor is closed, so a read never
    /// reaches a descriptor number taken again by another file).
    fd: Mutex<Option<RawFd>>,
    loss: Mutex<Loss>,
}

impl TcpProbe {
    /// What TCP says of the connection now; `None` when it is closed (or
    /// not made yet, or the kernel is older than 4.19).
    pub fn sent(&self) -> Option<Sent> {
        let fd = self.shared.fd.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the descriptor stays open while the lock is held: the
        // stream owning it clears it under this lock before closing it.
        let fd = unsafe { BorrowedFd::borrow_raw((*fd)?) };
        sent(fd).ok()
    }

    /// Whether the connection resent at least 1 in [`RESENT_ONE_IN`] of
    /// its recent segments (`false` once it is closed).
    pub fn loses_packets(&self) -> bool {
        self.look().is_some_and(|(_, lossy)| lossy)
    }

    /// What TCP says of the connection now, and whether it loses packets,
    /// from one reading; `None` when it is closed.
    pub fn look(&self) -> Option<(Sent, bool)> {
        let now = self.sent()?;
        Some((now, self.shared.loss.lock().unwrap_or_else(|e| e.into_inner()).lossy(now)))
    }

    /// Whether the connection is open.
    pub(crate) fn is_open(&self) -> bool {
        self.shared.fd.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Wraps the connection just made, which this probe looks at from now on.
    pub(crate) fn watch(&self, tcp: TcpStream) -> Probed {
        *self.shared.fd.lock().unwrap_or_else(|e| e.into_inner()) = Some(tcp.as_raw_fd());
        *self.shared.loss.lock().unwrap_or_else(|e| e.into_inner()) = Loss::default();
        Probed { tcp, probe: self.clone() }
    }
}

/// Whether a connection loses packets, from its totals over time.
#[derive(Debug, Default)]
struct Loss {
    /// The totals when the window began.
    start: Sent,
    /// The totals where it begins next, once [`WINDOW`] more are sent.
    next: Sent,
}

impl Loss {
    /// Takes the totals now: whether the window's segments were resent at
    /// least 1 in [`RESENT_ONE_IN`].
    fn lossy(&mut self, now: Sent) -> bool {
        if now.segments.wrapping_sub(self.next.segments) >= WINDOW {
            self.start = self.next;
            self.next = now;
        }
        let segments = now.segments.wrapping_sub(self.start.segments);
        // Not wrapping: a retransmission counted as lost while its peer's
        // D-SACK was on the way is taken back when it comes.
        let resent = now.retransmitted.saturating_sub(self.start.retransmitted);
        resent > 0 && u64::from(resent) * u64::from(RESENT_ONE_IN) >= u64::from(segments)
    }
}

/// `TCP_INFO`'s data segments sent and lost (Linux 4.19 and later).
fn sent(fd: BorrowedFd<'_>) -> io::Result<Sent> {
    // SAFETY: `tcp_info` is plain integers, so all-zero is a valid value;
    // the kernel writes at most `len` bytes into it and says how many.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let done = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    // A kernel older than 4.19 fills neither the duplicates (every spurious
    // retransmission would count as a loss) nor, before 4.6, the data
    // segments: no reading there, and no copies.
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_dsack_dups) + std::mem::size_of::<u32>();
    if (len as usize) < needed {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "TCP_INFO without tcpi_dsack_dups (Linux < 4.19)"));
    }
    // Still in flight, a retransmission may yet turn out a duplicate.
    let lost = info.tcpi_total_retrans.saturating_sub(info.tcpi_retrans).saturating_sub(info.tcpi_dsack_dups);
    Ok(Sent { segments: info.tcpi_data_segs_out, retransmitted: lost, resending: info.tcpi_retrans })
}

/// A connection its probe looks at: the stream the TLS session runs on.
pub(crate) struct Probed {
    tcp: TcpStream,
    probe: TcpProbe,
}

impl Drop for Probed {
    fn drop(&mut self) {
        // Before `tcp` (a field) is dropped, which closes the descriptor.
        let mut fd = self.probe.shared.fd.lock().unwrap_or_else(|e| e.into_inner());
        if *fd == Some(self.tcp.as_raw_fd()) {
            *fd = None;
        }
    }
}

impl AsyncRead for Probed {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Probed {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
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

    #[tokio::test]
    async fn a_connection_is_seen_while_it_is_open_and_not_after() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let probe = TcpProbe::default();
        assert_eq!(probe.sent(), None, "nothing to look at before a connection");
        let mut stream = probe.watch(TcpStream::connect(address).await.unwrap());
        let (mut server, _) = listener.accept().await.unwrap();
        stream.write_all(&[7; 100_000]).await.unwrap();
        let mut got = vec![0; 100_000];
        server.read_exact(&mut got).await.unwrap();
        let sent = probe.sent().expect("the connection is open");
        assert!(sent.segments >= 2, "{sent:?}: 100 kB is more than one segment");
        assert_eq!(sent.retransmitted, 0, "loopback loses nothing");
        drop(stream);
        assert_eq!(probe.sent(), None, "the descriptor is closed: no longer read");
        assert!(!probe.loses_packets());
    }

    fn sent(segments: u32, retransmitted: u32) -> Sent {
        Sent { segments, retransmitted, resending: 0 }
    }

    #[test]
    fn a_path_loses_packets_while_one_in_two_hundred_recent_segments_were_resent() {
        let mut loss = Loss::default();
        assert!(!loss.lossy(sent(0, 0)), "nothing sent");
        assert!(!loss.lossy(sent(100, 0)), "nothing resent");
        assert!(loss.lossy(sent(150, 1)), "1 in 150");
        assert!(!loss.lossy(sent(201, 1)), "1 in 201");
        assert!(loss.lossy(sent(1000, 5)), "1 in 200");
        // 2 % lost, as long as it lasts.
        let mut now = sent(1000, 5);
        for _ in 0..20 {
            now = sent(now.segments + 500, now.retransmitted + 10);
            assert!(loss.lossy(now), "{now:?}");
        }
        // Then clean: the window moves past the losses within two windows.
        let mut clean_for = 0;
        while loss.lossy(now) {
            now.segments += 100;
            clean_for += 100;
            assert!(clean_for <= 2 * WINDOW, "still lossy {clean_for} segments after the last loss");
        }
        assert!(clean_for >= WINDOW / 2, "a loss counts for a while: {clean_for}");
    }

    #[test]
    fn segment_totals_that_wrap_around_are_read_as_going_on() {
        let mut loss = Loss::default();
        assert!(!loss.lossy(sent(u32::MAX - 2500, 0)));
        assert!(!loss.lossy(sent(u32::MAX - 100, 0)));
        assert!(!loss.lossy(sent(300, 0)), "3,000 segments later, nothing resent");
        assert!(loss.lossy(sent(400, 20)), "20 of about 2,900");
    }

    #[test]
    fn a_loss_taken_back_counts_for_nothing() {
        let mut loss = Loss::default();
        assert!(!loss.lossy(sent(100, 0)));
        assert!(loss.lossy(sent(110, 1)), "one of 110 resent, not yet told a duplicate");
        assert!(!loss.lossy(sent(120, 0)), "the peer's D-SACK came: nothing was lost");
        assert!(!loss.lossy(sent(2500, 0)), "the window moves on");
        assert!(!loss.lossy(sent(2510, 0)));
    }
}
