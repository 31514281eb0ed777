//! The merge rule: the highest version wins (for one version, the higher
//! content), and every decision made without knowledge of one this node has
//! seen, that disagrees with it, is a conflict told once, here, when the
//! second of the two arrives.

use super::causal::Seen;
use super::claims;
use super::decision::{Decision, Entry};
use super::id::MinionId;

/// Two decisions about one id, made concurrently (or carrying one version
/// with two contents), that disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub id: MinionId,
    /// The one the merge rule prefers.
    pub winner: Seen,
    pub loser: Seen,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeOutcome {
    /// The incoming decision beats what is held: apply it.
    Apply,
    /// What is held beats it: the incoming decision loses (and is remembered).
    Superseded,
    /// The very same decision was seen already.
    Duplicate,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merged {
    pub outcome: MergeOutcome,
    /// Conflicts of the incoming decision with the decisions seen before it.
    pub conflicts: Vec<Conflict>,
}

/// Compares an incoming decision with the entry held for its id.
///
/// Which decision is held afterwards depends only on versions and contents,
/// so every node reaches the same state whatever order decisions arrive in
/// (the property tests check commutativity, associativity and idempotence).
pub fn merge(held: Option<&Entry>, incoming: &Decision) -> Merged {
    let Some(held) = held else {
        return Merged { outcome: MergeOutcome::Apply, conflicts: Vec::new() };
    };
    let incoming_seen = incoming.seen();
    let held_seen = held.held();
    let known = std::iter::once(&held_seen).chain(held.seen().iter());
    if known.clone().any(|seen| seen.same_as(&incoming_seen)) {
        return Merged { outcome: MergeOutcome::Duplicate, conflicts: Vec::new() };
    }
    let conflicts = known
        .filter(|seen| conflicting(seen, &incoming_seen))
        .map(|seen| {
            let (winner, loser) = if incoming_seen.beats(seen) {
                (incoming_seen.clone(), seen.clone())
            } else {
                (seen.clone(), incoming_seen.clone())
            };
            Conflict { id: incoming.id.clone(), winner, loser }
        })
        .collect();
    let outcome = if incoming_seen.beats(&held_seen) { MergeOutcome::Apply } else { MergeOutcome::Superseded };
    Merged { outcome, conflicts }
}

/// Two different decisions that disagree and were made without knowledge of
/// each other, or that carry one version with two contents. Claims are
/// concurrent with everything, but most of their disagreements are settled
/// by rule (`claims.rs`): only two keys claimed for one id, and a claim
/// rejecting the key a live decision accepted without knowing it, are
/// conflicts.
pub fn conflicting(a: &Seen, b: &Seen) -> bool {
    match (a.version.is_claim(), b.version.is_claim()) {
        (true, true) => a.fingerprint != b.fingerprint,
        (true, false) => claims::keeps_rejection(a, b),
        (false, true) => claims::keeps_rejection(b, a),
        (false, false) => !a.agrees_with(b) && (a.version == b.version || a.concurrent_with(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::causal::Context;
    use crate::core::decision::{PublicKey, Verdict};
    use crate::core::version::Version;
    use crate::testkit::PUB;

    /// A live version (claims are below `CLAIM_CEILING`).
    fn live(hlc: u64, node: &str) -> Version {
        Version::new(crate::core::version::CLAIM_CEILING + hlc, node)
    }

    fn decision(verdict: Verdict, hlc: u64, node: &str, knew: &[(u64, &str)]) -> Decision {
        Decision {
            id: MinionId::parse("web01").unwrap(),
            verdict,
            version: live(hlc, node),
            context: Context::new(knew.iter().map(|&(h, n)| live(h, n))),
            relays: Default::default(),
            reached: Default::default(),
        }
    }

    fn accepted() -> Verdict {
        Verdict::Accepted(PublicKey::new(PUB.as_bytes()))
    }

    fn rejected() -> Verdict {
        Verdict::Rejected(PublicKey::new(PUB.as_bytes()))
    }

    /// The entry a node holds after seeing `decisions` in order.
    fn held_after(decisions: &[&Decision]) -> Entry {
        let mut replica = crate::core::replica::Replica::new("x", Default::default());
        for d in decisions {
            replica.commit(d);
        }
        replica.entry(&decisions[0].id).unwrap().clone()
    }

    fn outcome(merged: Merged) -> (MergeOutcome, Vec<(Version, Version)>) {
        (merged.outcome, merged.conflicts.into_iter().map(|c| (c.winner.version, c.loser.version)).collect())
    }

    #[test]
    fn first_decision_applies() {
        let d = decision(accepted(), 10, "a", &[]);
        assert_eq!(outcome(merge(None, &d)), (MergeOutcome::Apply, vec![]));
    }

    #[test]
    fn the_same_decision_is_a_duplicate() {
        let d = decision(accepted(), 10, "a", &[]);
        assert_eq!(outcome(merge(Some(&d.entry()), &d)), (MergeOutcome::Duplicate, vec![]));
    }

    #[test]
    fn successive_decisions_are_not_conflicts() {
        let first = decision(accepted(), 10, "a", &[]);
        let second = decision(rejected(), 20, "b", &[(10, "a")]);
        assert_eq!(outcome(merge(Some(&first.entry()), &second)), (MergeOutcome::Apply, vec![]));
        assert_eq!(outcome(merge(Some(&second.entry()), &first)), (MergeOutcome::Superseded, vec![]));
    }

    #[test]
    fn concurrent_disagreeing_decisions_conflict_on_both_sides() {
        let on_a = decision(accepted(), 10, "a", &[(5, "c")]);
        let on_b = decision(rejected(), 11, "b", &[(5, "c")]);
        let want = vec![(on_b.version.clone(), on_a.version.clone())];
        assert_eq!(outcome(merge(Some(&on_a.entry()), &on_b)), (MergeOutcome::Apply, want.clone()));
        assert_eq!(outcome(merge(Some(&on_b.entry()), &on_a)), (MergeOutcome::Superseded, want));
    }

    #[test]
    fn concurrent_agreeing_decisions_do_not_conflict() {
        let on_a = decision(accepted(), 10, "a", &[]);
        let on_b = decision(accepted(), 11, "b", &[]);
        assert_eq!(outcome(merge(Some(&on_a.entry()), &on_b)), (MergeOutcome::Apply, vec![]));
    }

    #[test]
    fn ties_on_the_clock_break_by_node_name() {
        let on_a = decision(accepted(), 10, "a", &[]);
        let on_b = decision(Verdict::Deleted, 10, "b", &[]);
        assert_eq!(merge(Some(&on_a.entry()), &on_b).outcome, MergeOutcome::Apply);
        assert_eq!(merge(Some(&on_b.entry()), &on_a).outcome, MergeOutcome::Superseded);
    }

    /// SIM_SEED=1471 class: two concurrent rejects of different keys, then a
    /// delete that knew only one of them. Wherever the second reject arrives
    /// last, both of its conflicts are told: with the first reject and with
    /// the delete (a single "supersedes" version told neither).
    #[test]
    fn a_decision_overruled_unknowingly_conflicts_with_each_it_did_not_know() {
        let other_key = Verdict::Rejected(PublicKey::new(PUB.replace("mwIDAQAB", "mwIDAQAC").as_bytes()));
        let r1 = decision(rejected(), 10, "a", &[]);
        let r2 = decision(other_key, 11, "b", &[]);
        let d3 = decision(Verdict::Deleted, 20, "c", &[(10, "a")]);
        let held = held_after(&[&r1, &d3]);
        assert_eq!(
            outcome(merge(Some(&held), &r2)),
            (
                MergeOutcome::Superseded,
                vec![(d3.version.clone(), r2.version.clone()), (r2.version.clone(), r1.version.clone())]
            )
        );
        // Seen again (another peer, anti-entropy): nothing new.
        let held = held_after(&[&r1, &d3, &r2]);
        assert_eq!(outcome(merge(Some(&held), &r2)), (MergeOutcome::Duplicate, vec![]));
    }

    #[test]
    fn one_version_with_two_contents_is_a_conflict_resolved_alike_everywhere() {
        let accept = decision(accepted(), 10, "a", &[]);
        let forged = decision(rejected(), 10, "a", &[]);
        let want = vec![(forged.version.clone(), accept.version.clone())];
        assert_eq!(outcome(merge(Some(&accept.entry()), &forged)), (MergeOutcome::Apply, want.clone()));
        assert_eq!(outcome(merge(Some(&forged.entry()), &accept)), (MergeOutcome::Superseded, want));
    }
}
