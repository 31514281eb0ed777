//! systemd's notify protocol (`Type=notify`), without libsystemd: datagrams
//! to the socket named by `NOTIFY_SOCKET` saying READY=1, RELOADING=1,
//! STOPPING=1 and WATCHDOG=1. Outside systemd (no `NOTIFY_SOCKET`) every call
//! does nothing, so the agent behaves the same in a terminal or a test.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::node::{CoreHandle, Request};

/// Where state changes are announced; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Notifier {
    target: Option<std::sync::Arc<Target>>,
    /// Set at the first READY=1, with or without systemd: a failure before
    /// it is a refused start (see `has_been_ready`).
    ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Debug)]
struct Target {
    socket: UnixDatagram,
    addr: SocketAddr,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// From systemd's environment: `NOTIFY_SOCKET` (a path, or `@name` for
    /// the abstract namespace) and `WATCHDOG_USEC` (honoured only when
    /// `WATCHDOG_PID`, if set, is this process).
    pub fn from_env() -> Notifier {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return Notifier::default() };
        let watchdog = watchdog_interval(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
        );
        match Self::open(&path, watchdog) {
            Ok(target) => Notifier { target: Some(std::sync::Arc::new(target)), ..Notifier::default() },
            Err(e) => {
                tracing::warn!(socket = ?path, error = %e, "NOTIFY_SOCKET is set but unusable: no readiness or watchdog notifications");
                Notifier::default()
            }
        }
    }

    fn open(path: &std::ffi::OsStr, watchdog: Option<Duration>) -> std::io::Result<Target> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_bytes();
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name)?
            }
            None => SocketAddr::from_pathname(path)?,
        };
        Ok(Target { socket: UnixDatagram::unbound()?, addr, watchdog })
    }

    /// How often to send WATCHDOG=1: half of `WATCHDOG_USEC`, as systemd advises.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.target.as_ref().and_then(|t| t.watchdog)
    }

    /// Sends `state` (newline-separated `KEY=value` lines). A failure is
    /// logged, never fatal: the agent's work does not depend on systemd.
    pub fn send(&self, state: &str) {
        let Some(target) = &self.target else { return };
        if let Err(e) = target.socket.send_to_addr(state.as_bytes(), &target.addr) {
            tracing::warn!(error = %e, state, "cannot notify systemd");
        }
    }

    /// Listening, and the folders reconciled with the store.
    pub fn ready(&self, status: &str) {
        self.ready.store(true, std::sync::atomic::Ordering::Relaxed);
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// Whether the agent got as far as READY=1: an error before that is a
    /// set-up the operator must fix, which a restart would only repeat.
    pub fn has_been_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A reload began; systemd waits for the next READY=1.
    pub fn reloading(&self) {
        self.send(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()));
    }

    pub fn stopping(&self) {
        self.send("STOPPING=1");
    }

    /// Pings systemd's watchdog every half `WATCHDOG_USEC` for as long as the
    /// core task answers within that time, so a wedged core gets the agent
    /// restarted instead of kept alive by a timer that still runs.
    pub async fn watchdog(self, core: CoreHandle, shutdown: CancellationToken) {
        let Some(interval) = self.watchdog_interval() else { return };
        let mut timer = tokio::time::interval(interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_failing = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = timer.tick() => {}
            }
            let asked = async {
                let trouble = core.ask(|reply| Request::WriteTrouble { reply }).await?;
                Ok::<_, crate::node::CoreGone>((trouble, core.ask(|reply| Request::Stale { reply }).await?))
            };
            match tokio::time::timeout(interval, asked).await {
                // The core answers while writes fail (it retries them) and
                // while it offers nothing (stale): the service's status line
                // says so, `systemctl status` shows it.
                Ok(Ok((trouble, stale_since))) => {
                    let status = match (&trouble, &stale_since) {
                        (Some((lasted, error)), _) => {
                            Some(format!("STATUS={}", one_line(&write_trouble(*lasted, error))))
                        }
                        (None, Some(since)) => Some(format!("STATUS={}", one_line(&stale(since)))),
                        (None, None) if was_failing => Some("STATUS=writes succeed again".to_string()),
                        (None, None) => None,
                    };
                    was_failing = trouble.is_some();
                    match status {
                        Some(status) => self.send(&format!("WATCHDOG=1\n{status}")),
                        None => self.send("WATCHDOG=1"),
                    }
                }
                Ok(Err(_)) => return,
                Err(_) => tracing::warn!(waited = ?interval, "core task did not answer: withholding the watchdog ping"),
            }
        }
    }
}

/// What the log, the audit log, `status` and the service's status line say
/// of a master that may have missed deletes its peers have forgotten (the
/// audit record's reason, so `keysync-audit` words it).
pub use keysync_audit::stale;

/// What `status` and the service's status line say while writes fail.
pub fn write_trouble(lasted: Duration, error: &str) -> String {
    format!(
        "writes failing for {}: {error}; nothing recorded, retried every few seconds (free the disk: it catches up \
         by itself)",
        humantime::format_duration(Duration::from_secs(lasted.as_secs()))
    )
}

/// Half of `WATCHDOG_USEC`, if it is set, positive, and meant for this process.
fn watchdog_interval(usec: Option<&str>, pid: Option<&str>) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2))
}

/// CLOCK_MONOTONIC in microseconds, which systemd compares RELOADING=1 with.
fn monotonic_usec() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1000
}

/// STATUS= is one line.
fn one_line(text: &str) -> String {
    text.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_interval_is_half_and_only_for_this_process() {
        let me = std::process::id().to_string();
        assert_eq!(watchdog_interval(Some("30000000"), None), Some(Duration::from_secs(15)));
        assert_eq!(watchdog_interval(Some("30000000"), Some(&me)), Some(Duration::from_secs(15)));
        assert_eq!(watchdog_interval(Some("30000000"), Some("1")), None);
        assert_eq!(watchdog_interval(Some("0"), None), None);
        assert_eq!(watchdog_interval(Some("soon"), None), None);
        assert_eq!(watchdog_interval(None, None), None);
    }

    #[test]
    fn messages_reach_a_datagram_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier {
            target: Some(std::sync::Arc::new(Notifier::open(path.as_os_str(), None).unwrap())),
            ..Notifier::default()
        };
        let seen_by_main = notifier.clone();
        assert!(!seen_by_main.has_been_ready());
        notifier.ready("listening on 127.0.0.1:1\nreally");
        assert!(seen_by_main.has_been_ready(), "a clone sees READY=1 too");
        notifier.reloading();
        let mut buf = [0u8; 256];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=listening on 127.0.0.1:1 really");
        let n = listener.recv(&mut buf).unwrap();
        let text = std::str::from_utf8(&buf[..n]).unwrap();
        assert!(text.starts_with("RELOADING=1\nMONOTONIC_USEC="), "{text}");
        assert!(text.rsplit('=').next().unwrap().parse::<u64>().unwrap() > 0, "{text}");
    }
}
