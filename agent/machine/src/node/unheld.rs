//! Deletes of ids this master holds no decision for: they change nothing in
//! its folders, so they are neither kept in the store nor passed on. A peer
//! (mistaken or hostile) pushing deletes of made-up ids would otherwise grow
//! the store and the map of held ids without limit, and each master would
//! copy them to every other.
//!
//! Masters still agree: the digests anti-entropy compares leave tombstones
//! out (`core/replica.rs`), so a master holding one and a master that never
//! knew the id show alike. A tombstone is kept where the id was held: there
//! it stops an older decision about the id, arriving late (from a master
//! that was away), from bringing the key back.
//!
//! The last [`REMEMBERED`] such deletes are remembered, in memory only, for
//! the same reason: a delete can overtake the decision it deleted (another
//! path, a repair); when that decision comes, the remembered delete is
//! taken first and it arrives as superseded, never applied. Past that
//! bound, or after a restart, the older decision is applied, and the next
//! anti-entropy round with a master holding the tombstone deletes it again.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::core::{Decision, MinionId, Version};

/// How many deletes of unheld ids are remembered (a few hundred bytes each).
pub(super) const REMEMBERED: usize = 4096;

/// The last deletes of ids held nowhere here, oldest first out.
#[derive(Debug, Default)]
pub(super) struct Unheld {
    by_id: HashMap<MinionId, (Arc<str>, Decision)>,
    order: VecDeque<MinionId>,
}

impl Unheld {
    /// Remembers `decision` (a delete of an id not held) from `from`,
    /// forgetting the oldest past the bound. Of two for one id, the one the
    /// merge rule prefers stays.
    pub(super) fn remember(&mut self, from: Arc<str>, decision: Decision) {
        if let Some((_, known)) = self.by_id.get(&decision.id) {
            if !decision.seen().beats(&known.seen()) {
                return;
            }
        } else {
            self.order.push_back(decision.id.clone());
        }
        self.by_id.insert(decision.id.clone(), (from, decision));
        while self.order.len() > REMEMBERED {
            if let Some(oldest) = self.order.pop_front() {
                self.by_id.remove(&oldest);
            }
        }
    }

    /// The delete remembered for `id`, if any, forgotten here: it is about
    /// to be held (a decision about the id has come).
    pub(super) fn take(&mut self, id: &MinionId) -> Option<(Arc<str>, Decision)> {
        let taken = self.by_id.remove(id)?;
        self.order.retain(|known| known != id);
        Some(taken)
    }

    /// The version of the delete remembered for `id`: an operator's decision
    /// about the id made here knew it.
    pub(super) fn version(&self, id: &MinionId) -> Option<&Version> {
        self.by_id.get(id).map(|(_, d)| &d.version)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Context, Verdict};

    fn delete(id: &str, hlc: u64) -> Decision {
        Decision {
            id: MinionId::parse(id).unwrap(),
            verdict: Verdict::Deleted,
            version: Version::new(crate::core::version::CLAIM_CEILING + hlc, "b"),
            context: Context::default(),
            relays: Default::default(),
        }
    }

    #[test]
    fn remembers_a_bounded_number_oldest_out() {
        let mut unheld = Unheld::default();
        for i in 0..REMEMBERED + 10 {
            unheld.remember("b".into(), delete(&format!("made-up{i}"), 1));
        }
        assert_eq!(unheld.len(), REMEMBERED);
        assert!(unheld.version(&MinionId::parse("made-up0").unwrap()).is_none(), "the oldest is forgotten");
        let last = MinionId::parse(&format!("made-up{}", REMEMBERED + 9)).unwrap();
        assert!(unheld.take(&last).is_some());
        assert!(unheld.take(&last).is_none(), "taken once");
    }

    #[test]
    fn of_two_deletes_of_one_id_the_newer_stays() {
        let mut unheld = Unheld::default();
        unheld.remember("b".into(), delete("x", 5));
        unheld.remember("b".into(), delete("x", 3));
        let id = MinionId::parse("x").unwrap();
        assert_eq!(unheld.version(&id).unwrap().hlc, crate::core::version::CLAIM_CEILING + 5);
        assert_eq!(unheld.len(), 1);
    }
}
