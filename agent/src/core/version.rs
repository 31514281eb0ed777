//! Versions that totally order the decisions about one minion id, and the
//! hybrid logical clock that issues them.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// Bits of an HLC value below the millisecond part: a logical counter.
const LOGICAL_BITS: u32 = 16;

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
    /// below every version a running agent issues, so files found on a new or
    /// stale master never override a decision the cluster already holds.
    pub fn bootstrap(node: impl Into<Arc<str>>) -> Version {
        Version::new(0, node)
    }

    pub fn is_bootstrap(&self) -> bool {
        self.hlc == 0
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

    /// Issues a new value, strictly greater than any issued or observed.
    pub fn tick(&mut self, wall_ms: u64) -> u64 {
        let physical = wall_ms << LOGICAL_BITS;
        self.last = physical.max(self.last + 1);
        self.last
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
        assert!(Version::bootstrap("zzz") < a1);
        assert!(Version::bootstrap("a") < Version::bootstrap("b"));
    }

    #[test]
    fn clock_never_goes_back() {
        let mut clock = Hlc::default();
        let t1 = clock.tick(1000);
        let t2 = clock.tick(999); // wall clock stepped back
        let t3 = clock.tick(1000);
        assert!(t1 < t2 && t2 < t3);
        assert_eq!(t1, 1000 << 16);
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
