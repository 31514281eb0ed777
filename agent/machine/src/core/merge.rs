//! The merge rule: the highest version wins, and decisions made without
//! knowledge of each other that disagree are reported as conflicts.

use super::decision::{Decision, Entry};
use super::version::Version;

/// Two decisions about one id, made concurrently, that disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub winner: Version,
    pub loser: Version,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergeOutcome {
    /// The incoming decision is newer than what is held: apply it.
    Apply { conflict: Option<Conflict> },
    /// What is held is newer: the incoming decision loses.
    Superseded { conflict: Option<Conflict> },
    /// The very same decision is already held.
    Duplicate,
}

/// Compares an incoming decision with the entry held for its id.
///
/// The result depends only on the two versions, so every node reaches the
/// same state whatever order decisions arrive in (the property tests check
/// commutativity, associativity and idempotence).
pub fn merge(held: Option<&Entry>, incoming: &Decision) -> MergeOutcome {
    let Some(held) = held else {
        return MergeOutcome::Apply { conflict: None };
    };
    if held.version == incoming.version {
        return MergeOutcome::Duplicate;
    }
    let disagree = !held.same_verdict(&incoming.verdict);
    if incoming.version > held.version {
        let concurrent = !knew(incoming.supersedes.as_ref(), &held.version);
        let conflict = (concurrent && disagree)
            .then(|| Conflict { winner: incoming.version.clone(), loser: held.version.clone() });
        MergeOutcome::Apply { conflict }
    } else {
        let concurrent = !knew(held.supersedes.as_ref(), &incoming.version);
        let conflict = (concurrent && disagree)
            .then(|| Conflict { winner: held.version.clone(), loser: incoming.version.clone() });
        MergeOutcome::Superseded { conflict }
    }
}

/// Whether a decision that superseded `supersedes` was made with knowledge of
/// `other`: its origin then held `other` or something at least as new.
fn knew(supersedes: Option<&Version>, other: &Version) -> bool {
    supersedes.is_some_and(|seen| seen >= other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::decision::{PublicKey, Verdict};
    use crate::core::id::MinionId;
    use crate::testkit::PUB;

    fn decision(verdict: Verdict, hlc: u64, node: &str, supersedes: Option<(u64, &str)>) -> Decision {
        Decision {
            id: MinionId::parse("web01").unwrap(),
            verdict,
            version: Version::new(hlc, node),
            supersedes: supersedes.map(|(h, n)| Version::new(h, n)),
        }
    }

    fn accepted() -> Verdict {
        Verdict::Accepted(PublicKey::new(PUB.as_bytes()))
    }

    fn rejected() -> Verdict {
        Verdict::Rejected(PublicKey::new(PUB.as_bytes()))
    }

    #[test]
    fn first_decision_applies() {
        let d = decision(accepted(), 10, "a", None);
        assert_eq!(merge(None, &d), MergeOutcome::Apply { conflict: None });
    }

    #[test]
    fn same_version_is_a_duplicate() {
        let d = decision(accepted(), 10, "a", None);
        assert_eq!(merge(Some(&d.entry()), &d), MergeOutcome::Duplicate);
    }

    #[test]
    fn successive_decisions_are_not_conflicts() {
        let first = decision(accepted(), 10, "a", None);
        let second = decision(rejected(), 20, "b", Some((10, "a")));
        assert_eq!(merge(Some(&first.entry()), &second), MergeOutcome::Apply { conflict: None });
        assert_eq!(merge(Some(&second.entry()), &first), MergeOutcome::Superseded { conflict: None });
    }

    #[test]
    fn concurrent_disagreeing_decisions_conflict_on_both_sides() {
        let base = (5, "c");
        let on_a = decision(accepted(), 10, "a", Some(base));
        let on_b = decision(rejected(), 11, "b", Some(base));
        let want = Conflict { winner: on_b.version.clone(), loser: on_a.version.clone() };
        assert_eq!(merge(Some(&on_a.entry()), &on_b), MergeOutcome::Apply { conflict: Some(want.clone()) });
        assert_eq!(merge(Some(&on_b.entry()), &on_a), MergeOutcome::Superseded { conflict: Some(want) });
    }

    #[test]
    fn concurrent_agreeing_decisions_do_not_conflict() {
        let on_a = decision(accepted(), 10, "a", None);
        let on_b = decision(accepted(), 11, "b", None);
        assert_eq!(merge(Some(&on_a.entry()), &on_b), MergeOutcome::Apply { conflict: None });
    }

    #[test]
    fn ties_on_the_clock_break_by_node_name() {
        let on_a = decision(accepted(), 10, "a", None);
        let on_b = decision(Verdict::Deleted, 10, "b", None);
        assert!(matches!(merge(Some(&on_a.entry()), &on_b), MergeOutcome::Apply { .. }));
        assert!(matches!(merge(Some(&on_b.entry()), &on_a), MergeOutcome::Superseded { .. }));
    }

    #[test]
    fn bootstrap_files_never_override_the_cluster() {
        let cluster = decision(Verdict::Deleted, 1_795_000_000_000 << 16, "a", Some((1, "a")));
        let stale = Decision { version: Version::bootstrap("zzz", 1), ..decision(accepted(), 0, "zzz", None) };
        assert!(matches!(merge(Some(&cluster.entry()), &stale), MergeOutcome::Superseded { .. }));
        assert!(matches!(merge(Some(&stale.entry()), &cluster), MergeOutcome::Apply { .. }));
    }
}
