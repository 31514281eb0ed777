//! What a master held at its agent's first start, told as one audit record:
//! how many keys were accepted, rejected and pending, and a sha256 over the
//! sorted `(id, state, fingerprint)` list (the same on every master that
//! held the same), instead of one record per key. Disagreements with other
//! masters are told one by one as they meet (conflicts, applied changes).

use sha2::{Digest, Sha256};

use crate::core::{Decision, Verdict};

#[derive(Debug, Default)]
pub(super) struct Inventory {
    accepted: usize,
    rejected: usize,
    /// `id state fingerprint` per claim, digested once sorted.
    lines: Vec<String>,
}

/// The inventory, as told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub accepted: usize,
    pub rejected: usize,
    pub pending: usize,
    /// sha256 (hex) over `id state fingerprint` lines in id order.
    pub digest: String,
}

impl Inventory {
    /// Notes one of this master's claims.
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
        let fingerprint = claim.verdict.fingerprint().map(|f| f.to_string()).unwrap_or_default();
        self.lines.push(format!("{} {state} {fingerprint}\n", claim.id));
    }

    /// The inventory so far, and a fresh one.
    pub(super) fn take(&mut self, pending: usize) -> Held {
        let mut done = std::mem::take(self);
        done.lines.sort_unstable();
        let mut digest = Sha256::new();
        for line in &done.lines {
            digest.update(line.as_bytes());
        }
        Held { accepted: done.accepted, rejected: done.rejected, pending, digest: hex(&digest.finalize()) }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
