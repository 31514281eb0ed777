//! Versions that totally order the decisions about one minion id, and the
//! hybrid logical clock that issues them.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// Bits of an HLC value below the millisecond part: a logical counter.
const LOGICAL_BITS: u32 = 16;

/// Bootstrap versions live below this hlc; live ones (milliseconds << 16)
/// are far above it.
const BOOTSTRAP_CEILING: u64 = 1 << 42;

/// Node names a process has seen, shared: 100,000 versions from three
/// masters hold three allocations, not 100,000. Bounded, so a hostile peer
/// cannot grow it; past the bound names are simply not shared.
static NODE_NAMES: std::sync::Mutex<Vec<Arc<str>>> = std::sync::Mutex::new(Vec::new());
const MAX_SHARED_NODE_NAMES: usize = 256;

/// The shared copy of a node name (see [`NODE_NAMES`]).
pub fn node_name(name: &str) -> Arc<str> {
    let mut names = NODE_NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(shared) = names.iter().find(|n| &***n == name) {
        return shared.clone();
    }
    let shared: Arc<str> = Arc::from(name);
    if names.len() < MAX_SHARED_NODE_NAMES {
        names.push(shared.clone());
    }
    shared
}

/// `(hlc, origin node)`: compared by hlc first, then by node name, so two
/// nodes can never issue equal versions.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Version {
    pub hlc: u64,
    pub node: Arc<str>,
}

impl Version {
    pub fn new(hlc: u64, node: impl Into<Arc<str>>) -> Version {
        Version { hlc, node: node.into() }
    }

    /// The version of decisions found on an agent's very first start. It is
    /// below every version a running agent issues, and among bootstrap
    /// versions the EARLIER first start is higher, so files found on a new or
    /// stale master never override a decision the cluster already holds,
    /// not even another master's bootstrap decision.
    pub fn bootstrap(node: impl Into<Arc<str>>, wall_ms: u64) -> Version {
        Version::new(BOOTSTRAP_CEILING - 1 - wall_ms.min(BOOTSTRAP_CEILING - 1), node)
    }

    pub fn is_bootstrap(&self) -> bool {
        self.hlc < BOOTSTRAP_CEILING
    }

    /// Wall-clock milliseconds since the epoch at which this version was issued.
    pub fn millis(&self) -> u64 {
        self.hlc >> LOGICAL_BITS
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.hlc.cmp(&other.hlc).then_with(|| self.node.cmp(&other.node))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}@{}", self.millis(), self.hlc & 0xffff, self.node)
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Hybrid logical clock: wall-clock milliseconds in the high bits and a
/// counter in the low bits, never going backwards, and pushed forward by
/// every version seen from a peer so causally later decisions sort later
/// even between machines whose clocks disagree.
#[derive(Debug, Clone, Default)]
pub struct Hlc {
    last: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("version {version} is {ahead_ms} ms ahead of this node's clock (limit {max_skew_ms} ms)")]
pub struct SkewError {
    pub version: Version,
    pub ahead_ms: u64,
    pub max_skew_ms: u64,
}

impl Hlc {
    /// Resumes a clock from the highest value persisted before a restart.
    pub fn resume(last: u64) -> Hlc {
        Hlc { last }
    }

    pub fn last(&self) -> u64 {
        self.last
    }

    /// Issues a new value, strictly greater than any issued or observed,
    /// and above every bootstrap version whatever the wall clock says.
    pub fn tick(&mut self, wall_ms: u64) -> u64 {
        let physical = wall_ms << LOGICAL_BITS;
        self.last = physical.max(self.last + 1).max(BOOTSTRAP_CEILING);
        self.last
    }

    /// Moves the clock to at least `hlc` (a version held without a merge:
    /// loaded from the store or finished from the journal).
    pub fn witness(&mut self, hlc: u64) {
        self.last = self.last.max(hlc);
    }

    /// Checks a peer's version against the skew bound and, if it passes,
    /// moves the clock forward to it.
    pub fn observe(&mut self, version: &Version, wall_ms: u64, max_skew_ms: u64) -> Result<(), SkewError> {
        let limit = wall_ms.saturating_add(max_skew_ms);
        if version.millis() > limit {
            return Err(SkewError { version: version.clone(), ahead_ms: version.millis() - wall_ms, max_skew_ms });
        }
        self.last = self.last.max(version.hlc);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_hlc_then_node() {
        let a1 = Version::new(1 << 16, "a");
        let b1 = Version::new(1 << 16, "b");
        let a2 = Version::new(2 << 16, "a");
        assert!(a1 < b1 && b1 < a2);
        let now_ms = 1_795_000_000_000;
        let live = Version::new(now_ms << 16, "a");
        assert!(Version::bootstrap("zzz", now_ms) < live);
        assert!(Version::bootstrap("a", now_ms).is_bootstrap() && !live.is_bootstrap());
        // The master that joined first keeps its files; a later joiner's lose.
        assert!(Version::bootstrap("b", now_ms + 1) < Version::bootstrap("a", now_ms));
        assert!(Version::bootstrap("a", now_ms) < Version::bootstrap("b", now_ms));
    }

    #[test]
    fn clock_never_goes_back() {
        let mut clock = Hlc::default();
        let now_ms = 1_795_000_000_000;
        let t1 = clock.tick(now_ms);
        let t2 = clock.tick(now_ms - 1); // wall clock stepped back
        let t3 = clock.tick(now_ms);
        assert!(t1 < t2 && t2 < t3);
        assert_eq!(t1, now_ms << 16);
        // A clock near the epoch still issues live versions.
        assert!(!Version::new(Hlc::default().tick(5), "a").is_bootstrap());
    }

    #[test]
    fn observing_a_peer_moves_the_clock_forward() {
        let mut clock = Hlc::default();
        clock.observe(&Version::new(5000 << 16, "peer"), 4000, 2000).unwrap();
        assert!(clock.tick(4000) > 5000 << 16);
    }

    #[test]
    fn refuses_versions_beyond_the_skew_bound() {
        let mut clock = Hlc::default();
        let far = Version::new(10_000 << 16, "peer");
        let err = clock.observe(&far, 1000, 5000).unwrap_err();
        assert_eq!(err.ahead_ms, 9000);
        assert_eq!(clock.last(), 0, "a refused version must not move the clock");
    }
}
