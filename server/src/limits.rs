//! Strangers at the port: how many TLS handshakes may be in progress, per
//! source address and in all, with a share kept for the configured peers'
//! addresses, so that idle connections (260 of them locked a real peer out)
//! cannot starve the masters; and refusals told once per source per window
//! with a count, so that a flood cannot fill the audit log (321,552 records
//! in 25 s).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Handshake budgets of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Handshakes in progress from one source address.
    pub per_source: usize,
    /// Handshakes in progress from addresses that are not configured peers'.
    pub others: usize,
    /// Further handshakes only the configured peers' addresses may use.
    pub reserved: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits { per_source: 8, others: 192, reserved: 64 }
    }
}

/// Permits for handshakes in progress.
pub(crate) struct Gate {
    limits: ConnectionLimits,
    others: Arc<Semaphore>,
    reserved: Arc<Semaphore>,
    per_source: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A handshake's place: released when dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    _permit: OwnedSemaphorePermit,
    source: IpAddr,
    per_source: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self.per_source.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = counts.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.source);
            }
        }
    }
}

impl Gate {
    pub(crate) fn new(limits: ConnectionLimits) -> Gate {
        Gate {
            limits,
            others: Arc::new(Semaphore::new(limits.others)),
            reserved: Arc::new(Semaphore::new(limits.reserved)),
            per_source: Arc::default(),
        }
    }

    /// A place for a handshake from `source` (`is_peer`: one of the configured
    /// peers' addresses), or why there is none.
    pub(crate) fn admit(&self, source: IpAddr, is_peer: bool) -> Result<Admitted, String> {
        let mut counts = self.per_source.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = counts.get(&source).copied().unwrap_or(0);
        if n >= self.limits.per_source {
            return Err(format!("more than {} handshakes in progress from this address", self.limits.per_source));
        }
        let permit = match self.others.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) if is_peer => self.reserved.clone().try_acquire_owned().map_err(|_| {
                format!("more than {} handshakes in progress", self.limits.others + self.limits.reserved)
            })?,
            Err(_) => return Err(format!("more than {} handshakes in progress from strangers", self.limits.others)),
        };
        counts.insert(source, n + 1);
        Ok(Admitted { _permit: permit, source, per_source: self.per_source.clone() })
    }
}

/// Refusals from one source address presenting one identity (certificate
/// names, or none) within one window: a flood from one place is one line,
/// while a removed peer and a stranger behind the same address stay apart.
#[derive(Debug)]
struct Window {
    since: Instant,
    /// Refusals after the first, not told one by one.
    suppressed: u64,
    last_reason: String,
}

/// Tells the first refusal from each source per window, and then how many
/// more there were.
pub(crate) struct RefusalCounter {
    window: Duration,
    windows: HashMap<(IpAddr, String), Window>,
}

/// Most sources followed at once; refusals from further ones are counted
/// under the unspecified address (one line for all of them).
const MAX_SOURCES: usize = 4096;

/// A summary of refusals from one source.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Repeated {
    pub(crate) source: IpAddr,
    /// What the refused connections presented ("" for nothing).
    pub(crate) presented: String,
    pub(crate) count: u64,
    pub(crate) window: Duration,
    pub(crate) last_reason: String,
}

impl RefusalCounter {
    pub(crate) fn new(window: Duration) -> RefusalCounter {
        RefusalCounter { window, windows: HashMap::new() }
    }

    /// Whether a refusal from `source` is to be told (the first in its
    /// window); otherwise it is counted.
    pub(crate) fn note(&mut self, source: IpAddr, presented: &str, reason: &str, now: Instant) -> bool {
        let mut key = (source, presented.to_string());
        if self.windows.len() >= MAX_SOURCES && !self.windows.contains_key(&key) {
            key = (IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), String::new());
        }
        match self.windows.get_mut(&key) {
            Some(window) if now.duration_since(window.since) < self.window => {
                window.suppressed += 1;
                window.last_reason = reason.to_string();
                false
            }
            _ => {
                // A window that ended is summarised by `due`, not here.
                self.windows.insert(key, Window { since: now, suppressed: 0, last_reason: reason.to_string() });
                true
            }
        }
    }

    /// Summaries of the windows that ended, each once.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<Repeated> {
        let mut out = Vec::new();
        let window = self.window;
        self.windows.retain(|(source, presented), w| {
            let ended = now.duration_since(w.since) >= window;
            if ended && w.suppressed > 0 {
                out.push(Repeated {
                    source: *source,
                    presented: presented.clone(),
                    count: w.suppressed,
                    window,
                    last_reason: std::mem::take(&mut w.last_reason),
                });
            }
            !ended
        });
        if self.windows.is_empty() {
            self.windows.shrink_to_fit();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn each_source_and_strangers_together_are_bounded_and_peers_keep_a_share() {
        let gate = Gate::new(ConnectionLimits { per_source: 2, others: 3, reserved: 1 });
        let a1 = gate.admit(ip(2), false).unwrap();
        let _a2 = gate.admit(ip(2), false).unwrap();
        assert!(gate.admit(ip(2), false).unwrap_err().contains("from this address"));
        let _b = gate.admit(ip(3), false).unwrap();
        assert!(gate.admit(ip(4), false).unwrap_err().contains("from strangers"));
        let peer = gate.admit(ip(1), true).expect("a peer's address has its share");
        assert!(gate.admit(ip(1), true).is_err(), "the share is bounded too");
        drop(a1);
        drop(peer);
        assert!(gate.admit(ip(4), false).is_ok(), "places come back");
    }

    #[test]
    fn one_refusal_per_source_per_window_then_a_count() {
        let mut counter = RefusalCounter::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(counter.note(ip(2), "", "timeout", t0));
        for _ in 0..1000 {
            assert!(!counter.note(ip(2), "", "timeout", t0 + Duration::from_secs(1)));
        }
        assert!(counter.note(ip(3), "", "bad certificate", t0), "another source is told");
        assert!(counter.note(ip(2), "master-b", "names no configured peer", t0), "another identity is told");
        assert!(counter.due(t0 + Duration::from_secs(59)).is_empty());
        let due = counter.due(t0 + Duration::from_secs(60));
        let window = Duration::from_secs(60);
        let want =
            Repeated { source: ip(2), presented: String::new(), count: 1000, window, last_reason: "timeout".into() };
        assert_eq!(due, vec![want]);
        assert!(counter.due(t0 + Duration::from_secs(120)).is_empty(), "each summary once");
        assert!(counter.note(ip(2), "", "timeout", t0 + Duration::from_secs(121)), "a new window");
    }
}
