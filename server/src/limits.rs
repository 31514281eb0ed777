//! Strangers at the port: how many TLS handshakes may be in progress, per
//! source address and in all, with a share kept for the configured peers'
//! addresses, so that idle connections (260 of them locked a real peer out)
//! cannot starve the masters; and refusals told once per source per window
//! with a count, so that a flood cannot fill the audit log (321,552 records
//! in 25 s).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

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
    /// Per source, the handshakes in progress, oldest first.
    per_source: Arc<Mutex<Sources>>,
}

#[derive(Debug, Default)]
struct Sources {
    by_source: HashMap<IpAddr, VecDeque<Slot>>,
    next_id: u64,
}

/// One handshake in progress: its permit, and how to end it early.
#[derive(Debug)]
struct Slot {
    id: u64,
    permit: OwnedSemaphorePermit,
    evict: CancellationToken,
}

/// A handshake's place: released when dropped. `evicted` fires when a newer
/// handshake from a configured peer's address took it (see [`Gate::admit`]).
#[derive(Debug)]
pub(crate) struct Admitted {
    id: u64,
    source: IpAddr,
    pub(crate) evicted: CancellationToken,
    per_source: Arc<Mutex<Sources>>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut sources = self.per_source.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(slots) = sources.by_source.get_mut(&self.source) {
            slots.retain(|slot| slot.id != self.id);
            if slots.is_empty() {
                sources.by_source.remove(&self.source);
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
    /// peers' addresses), or why there is none. A peer's address that has
    /// its handshakes in progress already gets the place of its oldest one,
    /// which is ended: a local user on a peer's host (same address) holding
    /// idle connections cannot lock that peer out, since the peer's own
    /// handshake completes in milliseconds while the idle ones wait.
    pub(crate) fn admit(&self, source: IpAddr, is_peer: bool) -> Result<Admitted, String> {
        let mut sources = self.per_source.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = sources.next_id;
        sources.next_id += 1;
        let slots = sources.by_source.entry(source).or_default();
        let permit = if slots.len() >= self.limits.per_source {
            if !is_peer {
                return Err(format!("more than {} handshakes in progress from this address", self.limits.per_source));
            }
            let oldest = slots.pop_front().expect("at the limit, so not empty");
            oldest.evict.cancel();
            oldest.permit
        } else {
            let permit = match self.others.clone().try_acquire_owned() {
                Ok(permit) => Ok(permit),
                Err(_) if is_peer => self.reserved.clone().try_acquire_owned().map_err(|_| {
                    format!("more than {} handshakes in progress", self.limits.others + self.limits.reserved)
                }),
                Err(_) => Err(format!("more than {} handshakes in progress from strangers", self.limits.others)),
            };
            match permit {
                Ok(permit) => permit,
                Err(reason) => {
                    if slots.is_empty() {
                        sources.by_source.remove(&source);
                    }
                    return Err(reason);
                }
            }
        };
        let evicted = CancellationToken::new();
        slots.push_back(Slot { id, permit, evict: evicted.clone() });
        Ok(Admitted { id, source, evicted, per_source: self.per_source.clone() })
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

    /// Issue 27 item 8: idle connections from a peer's own address (a local
    /// user on its host) cannot lock the peer out: its newest handshake takes
    /// the oldest one's place, which is ended; strangers' addresses are
    /// still refused at their limit.
    #[test]
    fn a_peers_address_takes_the_place_of_its_oldest_handshake() {
        let gate = Gate::new(ConnectionLimits { per_source: 2, others: 2, reserved: 1 });
        let idle1 = gate.admit(ip(1), true).unwrap();
        let idle2 = gate.admit(ip(1), true).unwrap();
        let peer = gate.admit(ip(1), true).expect("not refused: the oldest makes room");
        assert!(idle1.evicted.is_cancelled(), "the oldest is ended");
        assert!(!idle2.evicted.is_cancelled() && !peer.evicted.is_cancelled());
        drop(idle1);
        let again = gate.admit(ip(1), true).unwrap();
        assert!(idle2.evicted.is_cancelled(), "then the next oldest");
        assert!(!peer.evicted.is_cancelled());
        drop((idle2, again, peer));
        let _s1 = gate.admit(ip(5), false).unwrap();
        let _s2 = gate.admit(ip(5), false).unwrap();
        assert!(gate.admit(ip(5), false).unwrap_err().contains("from this address"), "strangers are refused");
        assert!(gate.per_source.lock().unwrap().by_source.len() == 1, "nothing left of ip(1)");
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
