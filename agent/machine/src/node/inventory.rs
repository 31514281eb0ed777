//! What a master held at its agent's first start, told as one audit record:
//! how many keys were accepted, rejected and pending, and a sha256 over the
//! sorted `(id, state, fingerprint)` list (the same on every master that
//! held the same), instead of one record per key. Disagreements with other
//! masters are told one by one as they meet (conflicts, applied changes).
//!
//! The digest is fed as the claims are noted, not over a list kept until the
//! end: 100,000 lines kept for sorting were a third of a first start's peak
//! memory. Claims come in id order (the start-up reads names sorted), and
//! lines sort as their ids do except where an id continues another with a
//! byte up to `' '` (`web1` and `web1\tx`: the line `web1 accepted …`
//! sorts after `web1\tx …`). Such ids follow each other directly, so only
//! they are held back, sorted, until an id that cannot precede them comes.

use std::fmt::Write;

use sha2::{Digest, Sha256};

use crate::core::{Decision, MinionId, Verdict};

/// A line's bytes after its id and state: two spaces, the fingerprint
/// (32 bytes in hex, colon-separated), the newline.
const LINE_TAIL: usize = 2 + (32 * 3 - 1) + 1;

#[derive(Debug, Default)]
pub(super) struct Inventory {
    accepted: usize,
    rejected: usize,
    digest: Sha256,
    /// The first id of [`Inventory::group`].
    root: Option<MinionId>,
    /// `id state fingerprint` lines not digested yet: the root's and those
    /// of the ids right after it that continue it with a byte up to `' '`.
    group: Vec<String>,
}

/// The inventory, as told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub accepted: usize,
    pub rejected: usize,
    pub pending: usize,
    /// sha256 (hex) over `id state fingerprint` lines, sorted.
    pub digest: String,
}

impl Inventory {
    /// Notes one of this master's claims; claims come in id order.
    pub(super) fn note(&mut self, claim: &Decision) {
        let state = match &claim.verdict {
            Verdict::Accepted(_) => {
                self.accepted += 1;
                "accepted"
            }
            Verdict::Rejected(_) => {
                self.rejected += 1;
                "rejected"
            }
            Verdict::Deleted => return,
        };
        debug_assert!(self.root.as_ref().is_none_or(|root| *root < claim.id), "claims noted out of id order");
        if !self.root.as_ref().is_some_and(|root| may_sort_before(root, &claim.id)) {
            self.digest_group();
            self.root = Some(claim.id.clone());
        }
        // One line, formatted in place (a first start notes 1,000,000).
        let mut line = String::with_capacity(claim.id.as_str().len() + state.len() + LINE_TAIL);
        let _ = match claim.verdict.fingerprint() {
            Some(fingerprint) => writeln!(line, "{} {state} {fingerprint}", claim.id),
            None => writeln!(line, "{} {state} ", claim.id),
        };
        self.group.push(line);
    }

    /// Digests the lines held back, in their order.
    fn digest_group(&mut self) {
        self.group.sort_unstable();
        for line in self.group.drain(..) {
            self.digest.update(line.as_bytes());
        }
    }

    /// The inventory so far, and a fresh one.
    pub(super) fn take(&mut self, pending: usize) -> Held {
        let mut done = std::mem::take(self);
        done.digest_group();
        Held { accepted: done.accepted, rejected: done.rejected, pending, digest: hex(&done.digest.finalize()) }
    }
}

/// Whether the line of `later`, an id after `root`, may sort before the
/// root's line: `later` continues `root` with a byte up to `' '`. Every id
/// after `root` that does not sorts after the lines of all those that do.
fn may_sort_before(root: &MinionId, later: &MinionId) -> bool {
    let (root, later) = (root.as_str().as_bytes(), later.as_str().as_bytes());
    later.starts_with(root) && later.get(root.len()).is_some_and(|&byte| byte <= b' ')
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::decision::PublicKey;
    use crate::core::{Context, Version};
    use crate::testkit::PUB;

    fn claim(id: &str, rejected: bool) -> Decision {
        let key = PublicKey::new(PUB.as_bytes());
        let version = Version::claim(rejected, &key.fingerprint().0);
        let verdict = if rejected { Verdict::Rejected(key) } else { Verdict::Accepted(key) };
        Decision {
            id: MinionId::parse(id).unwrap(),
            verdict,
            version,
            context: Context::default(),
            relays: Default::default(),
            reached: Default::default(),
        }
    }

    /// The digest the docs' recipe computes: every line, sorted as bytes
    /// (`LC_ALL=C sort`), hashed.
    fn recipe(claims: &[Decision]) -> String {
        let mut lines: Vec<String> = claims
            .iter()
            .map(|c| {
                let state =
                    if c.verdict.kind() == crate::core::VerdictKind::Rejected { "rejected" } else { "accepted" };
                format!("{} {state} {}\n", c.id, c.verdict.fingerprint().unwrap())
            })
            .collect();
        lines.sort();
        hex(&Sha256::digest(lines.concat().as_bytes()))
    }

    #[test]
    fn the_digest_is_over_lines_sorted_as_bytes_whatever_the_ids() {
        let cases: &[&[&str]] = &[
            &[],
            &["web01"],
            &["web1", "web10", "web11", "web2"],
            // Ids continuing another with a byte up to ' ': their lines sort
            // before the shorter id's line.
            &["a", "a\tb", "a\tb\tc", "a b", "a bz", "a!", "ab", "b"],
            &["x", "x\u{1}", "x\u{1}\u{1}", "x ", "x accepted", "x rejected", "x zzz", "y"],
            &["m", "m a", "m accepted", "m accepted ", "m accepted\tq", "n"],
        ];
        for ids in cases {
            let mut ids: Vec<&str> = ids.to_vec();
            ids.sort();
            let claims: Vec<Decision> = ids.iter().enumerate().map(|(i, id)| claim(id, i % 3 == 1)).collect();
            let mut inventory = Inventory::default();
            for c in &claims {
                inventory.note(c);
            }
            let held = inventory.take(7);
            assert_eq!(held.digest, recipe(&claims), "{ids:?}");
            let n_rejected = claims.iter().filter(|c| c.verdict.kind() == crate::core::VerdictKind::Rejected).count();
            assert_eq!((held.accepted, held.rejected, held.pending), (claims.len() - n_rejected, n_rejected, 7));
            // Taken, it starts over.
            assert_eq!(inventory.take(0).digest, recipe(&[]));
        }
    }
}
