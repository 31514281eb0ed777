//! Versions that totally order the decisions about one minion id, and the
//! hybrid logical clock that issues them.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// Bits of an HLC value below the millisecond part: a logical counter.
pub const LOGICAL_BITS: u32 = 16;

/// Claims (what masters held at their agent's first start) live below this
/// hlc; live decisions (milliseconds << 16) are far above it.
pub const CLAIM_CEILING: u64 = 1 << 42;

/// The origin name of claims: not a node (no DNS label starts with `-`),
/// one per kind, so one key accepted (or rejected) on several masters is
/// one and the same claim.
pub const CLAIM_ACCEPT: &str = "-claim-accept";
pub const CLAIM_REJECT: &str = "-claim-reject";

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

    /// The version of a claim: what some master held at its agent's first
    /// start (see `claims.rs`). It names the content, not the master — the
    /// same key accepted on two masters is one claim, so agreeing masters
    /// hold the very same decision and exchange nothing — and it is below
    /// every version a running agent issues: any live decision beats it.
    pub fn claim(rejected: bool, fingerprint: &[u8; 32]) -> Version {
        let mut prefix = [0u8; 8];
        prefix[3..].copy_from_slice(&fingerprint[..5]);
        let node = if rejected { CLAIM_REJECT } else { CLAIM_ACCEPT };
        Version::new(1 + u64::from_be_bytes(prefix), node_name(node))
    }

    /// A claim (or a first-start decision of protocol 1's agents, which
    /// used the same range), not a decision made while agents ran.
    pub fn is_claim(&self) -> bool {
        self.hlc < CLAIM_CEILING
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
    /// `millis.logical@node`; a claim is `claim:accept:` or `claim:reject:`
    /// and its key's fingerprint prefix (the first five bytes, in hex).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.node {
            CLAIM_ACCEPT => write!(f, "claim:accept:{:010x}", self.hlc - 1),
            CLAIM_REJECT => write!(f, "claim:reject:{:010x}", self.hlc - 1),
            _ => write!(f, "{}.{}@{}", self.millis(), self.hlc & 0xffff, self.node),
        }
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
    /// and above every claim whatever the wall clock says.
    pub fn tick(&mut self, wall_ms: u64) -> u64 {
        let physical = wall_ms << LOGICAL_BITS;
        self.last = physical.max(self.last + 1).max(CLAIM_CEILING);
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

/// Per origin, the newest delete forgotten: notes one made at `millis`.
pub fn note_forgotten(forgot: &mut Vec<(Arc<str>, u64)>, origin: &Arc<str>, millis: u64) {
    match forgot.iter_mut().find(|(o, _)| o == origin) {
        Some((_, ms)) => *ms = (*ms).max(millis),
        None => forgot.push((origin.clone(), millis)),
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
        let claim = Version::claim(true, &[0xff; 32]);
        assert!(claim < live && claim.is_claim() && !live.is_claim());
        // A claim names its content: the same on every master, another for another key or kind.
        assert_eq!(Version::claim(false, &[7; 32]), Version::claim(false, &[7; 32]));
        assert_ne!(Version::claim(false, &[7; 32]), Version::claim(true, &[7; 32]));
        assert_ne!(Version::claim(false, &[7; 32]), Version::claim(false, &[8; 32]));
        assert_eq!(Version::claim(true, &[0xab; 32]).to_string(), "claim:reject:ababababab");
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
        assert!(!Version::new(Hlc::default().tick(5), "a").is_claim());
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
