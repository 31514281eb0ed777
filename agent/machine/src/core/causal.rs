//! What a decision knew: its causal context. For one minion id, a context
//! holds the highest version the deciding node had seen from each node (a
//! version vector over the id's history), so two decisions are concurrent
//! exactly when neither's context covers the other's version — a single
//! "version it replaced" cannot tell that: a later delete that knew one of
//! two concurrent rejects would hide the other one.
//!
//! A node's decisions on one id are made one after the other, each knowing
//! the one before, so the highest version per node is all a context needs.

use std::fmt;

use super::decision::{Fingerprint, VerdictKind};
use super::version::Version;

/// The versions of one id a decision's origin had seen, one per node.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Context(Box<[Version]>);

impl Context {
    pub fn new(versions: impl IntoIterator<Item = Version>) -> Context {
        let mut context = Context::default();
        for version in versions {
            context.add(&version);
        }
        context
    }

    /// Whether a decision with this context knew `version`. A claim names
    /// its content, not a node's history: it is known only by itself.
    pub fn knows(&self, version: &Version) -> bool {
        if version.is_claim() {
            return self.0.contains(version);
        }
        self.0.iter().any(|known| !known.is_claim() && known.node == version.node && known.hlc >= version.hlc)
    }

    /// Adds `version` (raising its node's entry if it is newer; a claim is
    /// kept as it is, beside the others).
    pub fn add(&mut self, version: &Version) {
        let slot = if version.is_claim() {
            self.0.iter().position(|known| known == version)
        } else {
            self.0.iter().position(|known| !known.is_claim() && known.node == version.node)
        };
        match slot {
            Some(at) if self.0[at].hlc >= version.hlc => {}
            Some(at) => self.0[at] = version.clone(),
            None => {
                let mut versions = std::mem::take(&mut self.0).into_vec();
                let at = versions.partition_point(|known| (&known.node, known.hlc) < (&version.node, version.hlc));
                versions.insert(at, version.clone());
                self.0 = versions.into_boxed_slice();
            }
        }
    }

    /// Adds every version of `other`.
    pub fn join(&mut self, other: &Context) {
        for version in other.iter() {
            self.add(version);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Version> {
        self.0.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The highest version known: the one its origin held when it decided
    /// (what agents of protocol 1 call `supersedes`).
    pub fn highest(&self) -> Option<&Version> {
        self.0.iter().max()
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

/// A decision about an id as kept for telling conflicts: everything but its
/// key bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub version: Version,
    pub kind: VerdictKind,
    pub fingerprint: Option<Fingerprint>,
    pub context: Context,
}

impl Seen {
    /// Whether this decision was made knowing `other`.
    pub fn knows(&self, other: &Seen) -> bool {
        self.version == other.version || self.context.knows(&other.version)
    }

    /// Neither knew the other: made concurrently.
    pub fn concurrent_with(&self, other: &Seen) -> bool {
        !self.knows(other) && !other.knows(self)
    }

    /// Says the same thing (kind and key) as `other`.
    pub fn agrees_with(&self, other: &Seen) -> bool {
        self.kind == other.kind && self.fingerprint == other.fingerprint
    }

    /// The same decision: same version and content.
    pub fn same_as(&self, other: &Seen) -> bool {
        self.version == other.version && self.agrees_with(other)
    }

    /// Orders two contents given one version (a forgery or a bug: one
    /// version is one decision): a rejection beats a delete beats an
    /// acceptance, then the higher fingerprint. Every node picks alike.
    pub fn content_rank(&self) -> (u8, Option<Fingerprint>) {
        let kind = match self.kind {
            VerdictKind::Accepted => 0,
            VerdictKind::Deleted => 1,
            VerdictKind::Rejected => 2,
        };
        (kind, self.fingerprint)
    }

    /// Whether this decision wins over `other` by the merge rule: the
    /// higher version, and for one version the higher content.
    pub fn beats(&self, other: &Seen) -> bool {
        (&self.version, self.content_rank()) > (&other.version, other.content_rank())
    }
}

/// Most decisions kept per id besides the one held, for telling conflicts.
/// An id that has seen more forgets its oldest live decision (a conflict
/// with one of those is then missed, never invented), and its claims only
/// when it knows nothing else.
pub const MAX_SEEN: usize = 64;

/// Adds `seen` to an id's list of other decisions seen, oldest dropped past
/// [`MAX_SEEN`]; nothing when the very same decision is there already.
pub fn remember(list: &mut Vec<Seen>, seen: Seen) {
    if list.iter().any(|s| s.same_as(&seen)) {
        return;
    }
    let at = list.partition_point(|s| (&s.version, s.content_rank()) < (&seen.version, seen.content_rank()));
    list.insert(at, seen);
    if list.len() > MAX_SEEN {
        // The oldest decision goes; claims last, as what a master shows
        // after first contact depends on every claim known (`claims.rs`).
        let oldest = list.iter().position(|s| !s.version.is_claim()).unwrap_or(0);
        list.remove(oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live version (claims are below `CLAIM_CEILING`).
    fn v(hlc: u64, node: &str) -> Version {
        Version::new(crate::core::version::CLAIM_CEILING + hlc, node)
    }

    fn seen(hlc: u64, node: &str, kind: VerdictKind, context: &[(u64, &str)]) -> Seen {
        Seen {
            version: v(hlc, node),
            kind,
            fingerprint: None,
            context: Context::new(context.iter().map(|&(h, n)| v(h, n))),
        }
    }

    #[test]
    fn a_context_keeps_the_highest_version_per_node() {
        let mut context = Context::new([v(5, "b"), v(3, "a"), v(7, "b")]);
        assert_eq!(context.iter().cloned().collect::<Vec<_>>(), [v(3, "a"), v(7, "b")]);
        context.join(&Context::new([v(9, "a"), v(1, "b"), v(2, "c")]));
        assert_eq!(context.iter().cloned().collect::<Vec<_>>(), [v(9, "a"), v(7, "b"), v(2, "c")]);
        assert!(context.knows(&v(7, "b")) && context.knows(&v(6, "b")) && !context.knows(&v(8, "b")));
        assert!(!context.knows(&v(1, "d")));
        assert_eq!(context.highest(), Some(&v(9, "a")));
    }

    #[test]
    fn concurrency_is_knowing_neither() {
        // r1 at a and r2 at b, neither knowing the other; d3 at c knew r1 only.
        let r1 = seen(10, "a", VerdictKind::Rejected, &[]);
        let r2 = seen(11, "b", VerdictKind::Rejected, &[]);
        let d3 = seen(20, "c", VerdictKind::Deleted, &[(10, "a")]);
        assert!(r1.concurrent_with(&r2));
        assert!(!d3.concurrent_with(&r1), "d3 knew r1");
        assert!(d3.concurrent_with(&r2), "d3 did not know r2, though its version is higher");
    }

    #[test]
    fn remembering_keeps_order_drops_repeats_and_is_bounded() {
        let mut list = Vec::new();
        for hlc in (0..MAX_SEEN as u64 + 5).rev() {
            remember(&mut list, seen(hlc, "a", VerdictKind::Accepted, &[]));
        }
        remember(&mut list, seen(30, "a", VerdictKind::Accepted, &[]));
        assert_eq!(list.len(), MAX_SEEN);
        assert_eq!(list[0].version, v(5, "a"), "the oldest are forgotten");
        assert!(list.windows(2).all(|w| w[0].version < w[1].version));
    }
}
