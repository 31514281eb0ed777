//! Anti-entropy digests: the id space is split into buckets, each summarised
//! by the XOR of its entries' hashes, so two nodes find the few buckets where
//! they differ by exchanging one small vector.

use sha2::{Digest, Sha256};

use super::causal::Seen;
use super::id::MinionId;

/// Buckets of the id space. 1,024 digests are 8 KiB on the wire; with 100,000
/// keys a bucket holds about 100 entries, so one differing key costs 8 KiB
/// plus one bucket's summaries.
pub const N_BUCKETS: usize = 1024;

pub fn bucket_of(id: &MinionId) -> usize {
    let hash = Sha256::digest(id.as_str().as_bytes());
    usize::from(u16::from_be_bytes([hash[0], hash[1]])) % N_BUCKETS
}

/// A list of buckets that is no set of the id space's buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadBuckets {
    /// The first bucket out of range.
    NoSuchBucket(u32),
    /// The first bucket named twice.
    Twice(u32),
}

/// Checks that `buckets` are each one of the [`N_BUCKETS`], none twice.
pub fn check_buckets(buckets: impl IntoIterator<Item = u32>) -> Result<(), BadBuckets> {
    let mut named = [false; N_BUCKETS];
    for bucket in buckets {
        let slot = named.get_mut(bucket as usize).ok_or(BadBuckets::NoSuchBucket(bucket))?;
        if std::mem::replace(slot, true) {
            return Err(BadBuckets::Twice(bucket));
        }
    }
    Ok(())
}

/// The hash of the decision held for `id`: its version and what it says, so
/// one version carried with two contents (a forgery, or a bug) shows as a
/// difference instead of hiding behind equal versions.
fn entry_hash(id: &MinionId, held: &Seen) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(id.as_str().as_bytes());
    hasher.update([0]);
    hasher.update(held.version.hlc.to_be_bytes());
    hasher.update(held.version.node.as_bytes());
    hasher.update([0, held.kind as u8]);
    if let Some(fingerprint) = held.fingerprint {
        hasher.update(fingerprint.0);
    }
    let hash = hasher.finalize();
    u64::from_be_bytes(hash[..8].try_into().expect("sha256 is 32 bytes"))
}

/// Per-bucket digests, updated incrementally as entries change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digests {
    buckets: Vec<u64>,
}

impl Default for Digests {
    fn default() -> Self {
        Digests { buckets: vec![0; N_BUCKETS] }
    }
}

impl Digests {
    /// Records that `id` moved from holding `old` (if anything) to `new`.
    pub fn replace(&mut self, id: &MinionId, old: Option<&Seen>, new: &Seen) {
        if let Some(old) = old {
            self.toggle(id, old);
        }
        self.toggle(id, new);
    }

    /// Adds `part` of `id`'s state to its bucket, or takes it out if it was
    /// in (XOR).
    pub fn toggle(&mut self, id: &MinionId, part: &Seen) {
        self.buckets[bucket_of(id)] ^= entry_hash(id, part);
    }

    pub fn as_slice(&self) -> &[u64] {
        &self.buckets
    }

    /// Buckets whose digest differs from `theirs`; all of them when the
    /// other side uses a different bucket count.
    pub fn differing(&self, theirs: &[u64]) -> Vec<u32> {
        if theirs.len() != self.buckets.len() {
            return (0..N_BUCKETS as u32).collect();
        }
        let pairs = self.buckets.iter().zip(theirs);
        (0u32..).zip(pairs).filter(|(_, (mine, theirs))| mine != theirs).map(|(idx, _)| idx).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::decision::VerdictKind;
    use crate::core::version::Version;

    fn id(s: &str) -> MinionId {
        MinionId::parse(s).unwrap()
    }

    fn held(hlc: u64, node: &str, kind: VerdictKind) -> Seen {
        Seen { version: Version::new(hlc, node), kind, fingerprint: None, context: Default::default() }
    }

    #[test]
    fn a_list_of_buckets_is_checked_for_range_and_repeats() {
        assert_eq!(check_buckets([0, 5, 1023]), Ok(()));
        assert_eq!(check_buckets([3, 1024, 3]), Err(BadBuckets::NoSuchBucket(1024)));
        assert_eq!(check_buckets([3, 7, 3, 2000]), Err(BadBuckets::Twice(3)));
    }

    #[test]
    fn equal_contents_give_equal_digests_in_any_order() {
        let (a, b) = (id("a"), id("b"));
        let (v1, v2) = (held(1, "n1", VerdictKind::Accepted), held(2, "n2", VerdictKind::Deleted));
        let x = held(0, "x", VerdictKind::Accepted);
        let mut one = Digests::default();
        one.replace(&a, None, &v1);
        one.replace(&b, None, &v2);
        let mut two = Digests::default();
        two.replace(&b, None, &x);
        two.replace(&a, None, &v1);
        two.replace(&b, Some(&x), &v2);
        assert_eq!(one, two);
        assert!(one.differing(two.as_slice()).is_empty());
    }

    #[test]
    fn one_changed_entry_shows_in_one_bucket() {
        let mut one = Digests::default();
        let mut two = Digests::default();
        for n in 0..500 {
            let minion = id(&format!("m{n}"));
            one.replace(&minion, None, &held(n, "a", VerdictKind::Accepted));
            two.replace(&minion, None, &held(n, "a", VerdictKind::Accepted));
        }
        let changed = id("m42");
        two.replace(&changed, Some(&held(42, "a", VerdictKind::Accepted)), &held(1000, "b", VerdictKind::Deleted));
        assert_eq!(one.differing(two.as_slice()), vec![bucket_of(&changed) as u32]);
        assert_eq!(one.differing(&[0; 3]).len(), N_BUCKETS, "a bucket-count mismatch compares everything");
    }

    #[test]
    fn one_version_with_another_content_shows() {
        let minion = id("m1");
        let mut one = Digests::default();
        let mut two = Digests::default();
        one.replace(&minion, None, &held(7, "a", VerdictKind::Accepted));
        two.replace(&minion, None, &held(7, "a", VerdictKind::Rejected));
        assert_eq!(one.differing(two.as_slice()), vec![bucket_of(&minion) as u32]);
    }
}
