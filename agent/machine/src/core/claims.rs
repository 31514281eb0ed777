//! First contact: what masters held before their agents existed.
//!
//! What a master holds at its agent's first start is a *claim*, not a
//! decision. A claim names its content (a key, accepted or rejected), so
//! masters that agree hold the very same claim: nothing to write, nothing to
//! send. Claims that disagree meet by one rule, the same on every master
//! whatever the order:
//!
//! - a rejection beats an acceptance of the same key (Salt's own precedence
//!   within one master);
//! - accepted or rejected beats pending and absent;
//! - two different keys accepted or rejected for one id are a conflict no
//!   rule settles: every master keeps what it held (a master that held
//!   neither key trusts neither), and it is shown until a live decision
//!   settles it.
//!
//! A live decision (made with `salt-key` while the agents run) beats every
//! claim, whenever the claim arrives, with one exception on the side of
//! safety: a master whose claim rejects the very key the cluster accepted
//! live, by a decision made without knowledge of that rejection, keeps its
//! rejection (a conflict, shown, until a decision made knowing it).

use super::causal::Seen;
use super::decision::{Entry, VerdictKind};

/// What a master's folders should say for an id: the decision whose content
/// they show (accepted or rejected key, or deleted), or `None` when nothing
/// is decided there (no key accepted or rejected).
pub fn effective(entry: &Entry) -> Option<Seen> {
    if entry.seen().is_empty() {
        // Nothing else seen (every id of a first start, most ids after):
        // what is held shows, a claim or not. The rules give the same
        // (`nothing_else_seen_shows_what_is_held`), through six copies of
        // it: 7 % of a first start's CPU.
        return Some(entry.held());
    }
    by_the_rules(entry)
}

/// [`effective`], by the rules of first contact.
fn by_the_rules(entry: &Entry) -> Option<Seen> {
    let held = entry.held();
    let mine = entry.mine().and_then(|version| find(entry, version));
    if !held.version.is_claim() {
        return match mine {
            Some(mine) if keeps_rejection(&mine, &held) => Some(mine),
            _ => Some(held),
        };
    }
    let claims = claims(entry);
    let first = claims.first()?;
    if claims.iter().all(|c| c.fingerprint == first.fingerprint) {
        return of_key(&claims, first);
    }
    // Two keys: no rule settles it; each master keeps its own (rejected, if
    // another master rejected that very key).
    of_key(&claims, &mine?)
}

/// The claim that stands for `key`'s fingerprint: its rejection if any
/// master rejected it, else its acceptance.
fn of_key(claims: &[Seen], key: &Seen) -> Option<Seen> {
    let same: Vec<&Seen> = claims.iter().filter(|c| c.fingerprint == key.fingerprint).collect();
    let rejected = same.iter().find(|c| c.kind == VerdictKind::Rejected);
    rejected.or(same.first()).map(|c| (*c).clone()).or_else(|| Some(key.clone()))
}

/// Whether the masters may show different things for this id until an
/// operator decides: claims with two keys and no live decision, or a claim
/// rejecting the key a live decision accepted without knowing that rejection.
pub fn unsettled(entry: &Entry) -> bool {
    // Nothing else seen: one decision cannot disagree with itself. `status`
    // asks this of every id (`Node::conflicts`), and the rules below copy
    // each decision first.
    if entry.seen().is_empty() {
        return false;
    }
    unsettled_by_the_rules(entry)
}

/// [`unsettled`], by the rules.
fn unsettled_by_the_rules(entry: &Entry) -> bool {
    let held = entry.held();
    let claims = claims(entry);
    if held.version.is_claim() {
        return claims.iter().any(|c| c.fingerprint != held.fingerprint);
    }
    claims.iter().any(|claim| keeps_rejection(claim, &held))
}

/// Why a master whose entry is now `entry` shows `shows` rather than what
/// `incoming` says (for the audit log).
pub fn why(entry: &Entry, shows: Option<&Seen>, incoming: &Seen) -> &'static str {
    let held = entry.held();
    let Some(shows) = shows else {
        return "two different keys were held for this id when the agents met: this master held neither and trusts neither until an operator decides";
    };
    if shows.version.is_claim() && !held.version.is_claim() {
        return "this master rejected this key before its agent started, and the live accept did not know it: the rejection stays until an operator decides";
    }
    if !incoming.version.is_claim() {
        return "a live decision beats every claim";
    }
    if !held.version.is_claim() {
        return "held before this master's agent started, which the cluster has decided since: a live decision beats every claim";
    }
    if shows.fingerprint == incoming.fingerprint && shows.kind == VerdictKind::Rejected {
        return "a rejection beats an acceptance of the same key";
    }
    if shows.fingerprint != incoming.fingerprint {
        return "two different keys were held for this id when the agents met: this master keeps its own until an operator decides";
    }
    "accepted or rejected beats pending and absent"
}

/// Every claim about the id this node knows (held or remembered).
pub fn claims(entry: &Entry) -> Vec<Seen> {
    entry.decisions().filter(|s| s.version.is_claim()).collect()
}

/// A claim rejecting the key `live` accepts, which `live` did not know of.
pub(crate) fn keeps_rejection(claim: &Seen, live: &Seen) -> bool {
    claim.kind == VerdictKind::Rejected
        && live.kind == VerdictKind::Accepted
        && claim.fingerprint == live.fingerprint
        && !live.context.knows(&claim.version)
}

fn find(entry: &Entry, version: &super::version::Version) -> Option<Seen> {
    entry.decisions().find(|s| s.version == *version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::causal::{remember, Context};
    use crate::core::decision::Fingerprint;
    use crate::core::version::Version;

    fn fp(n: u8) -> Fingerprint {
        Fingerprint([n; 32])
    }

    fn claim(kind: VerdictKind, key: u8) -> Seen {
        Seen {
            version: Version::claim(kind == VerdictKind::Rejected, &fp(key).0),
            kind,
            fingerprint: Some(fp(key)),
            context: Context::default(),
        }
    }

    fn live(kind: VerdictKind, key: Option<u8>, ms: u64, knew: &[&Seen]) -> Seen {
        Seen {
            version: Version::new(ms << 16, "master-x"),
            kind,
            fingerprint: key.map(fp),
            context: Context::new(knew.iter().map(|s| s.version.clone())),
        }
    }

    /// The entry a master holds after seeing `all`, `mine` its own claim.
    fn entry(all: &[&Seen], mine: Option<&Seen>) -> Entry {
        let mut sorted: Vec<&Seen> = all.to_vec();
        sorted.sort_by(|a, b| (&a.version, a.content_rank()).cmp(&(&b.version, b.content_rank())));
        let held = sorted.pop().unwrap();
        let mut seen = Vec::new();
        for s in sorted {
            remember(&mut seen, s.clone());
        }
        Entry::new(held.kind, held.fingerprint, held.version.clone(), held.context.clone())
            .with_seen(seen)
            .with_mine(mine.map(|m| m.version.clone()))
    }

    fn shows(all: &[&Seen], mine: Option<&Seen>) -> Option<(VerdictKind, Option<u8>)> {
        effective(&entry(all, mine)).map(|s| (s.kind, s.fingerprint.map(|f| f.0[0])))
    }

    use VerdictKind::{Accepted as A, Deleted as D, Rejected as R};

    /// An entry holding one decision and nothing else seen shows it, as
    /// the rules say, whether it is a claim or live, and this master's own
    /// claim or not.
    #[test]
    fn nothing_else_seen_shows_what_is_held() {
        let held = [
            claim(A, 1),
            claim(R, 1),
            live(A, Some(1), 1_800_000_000_000, &[]),
            live(R, Some(2), 1_800_000_000_000, &[]),
            live(D, None, 1_800_000_000_000, &[]),
        ];
        for one in &held {
            for mine in [None, Some(one), Some(&held[0]), Some(&held[1])] {
                let entry = entry(&[one], mine);
                assert!(entry.seen().is_empty());
                assert_eq!(effective(&entry), by_the_rules(&entry), "{one:?}, mine {mine:?}");
                assert_eq!(effective(&entry), Some(one.clone()));
                assert!(!unsettled(&entry));
                assert_eq!(unsettled(&entry), unsettled_by_the_rules(&entry), "{one:?}, mine {mine:?}");
            }
        }
    }

    /// The table of docs/adopting.md: what each master shows after first
    /// contact, given what it held and what the others held.
    #[test]
    fn claims_meet_by_one_rule() {
        let (acc1, rej1, acc2) = (claim(A, 1), claim(R, 1), claim(A, 2));
        // Agreeing claims: one claim, shown as it is.
        assert_eq!(shows(&[&acc1], Some(&acc1)), Some((A, Some(1))));
        // Accepted beats pending and absent: a master that held nothing follows.
        assert_eq!(shows(&[&acc1], None), Some((A, Some(1))));
        // A rejection beats an acceptance of the same key, on both masters.
        assert_eq!(shows(&[&acc1, &rej1], Some(&acc1)), Some((R, Some(1))));
        assert_eq!(shows(&[&acc1, &rej1], Some(&rej1)), Some((R, Some(1))));
        // Two keys: each keeps its own, a master that held neither trusts neither.
        assert_eq!(shows(&[&acc1, &acc2], Some(&acc1)), Some((A, Some(1))));
        assert_eq!(shows(&[&acc1, &acc2], Some(&acc2)), Some((A, Some(2))));
        assert_eq!(shows(&[&acc1, &acc2], None), None);
        assert!(unsettled(&entry(&[&acc1, &acc2], None)));
        assert!(!unsettled(&entry(&[&acc1, &rej1], None)), "settled by the rule");
        // Three masters: the rule per key first, then each keeps its own.
        let all = [&acc1, &rej1, &acc2];
        assert_eq!(shows(&all, Some(&acc1)), Some((R, Some(1))), "k1 was rejected elsewhere");
        assert_eq!(shows(&all, Some(&rej1)), Some((R, Some(1))));
        assert_eq!(shows(&all, Some(&acc2)), Some((A, Some(2))));
        assert_eq!(shows(&all, None), None);
    }

    #[test]
    fn a_live_decision_beats_every_claim_but_a_rejection_it_did_not_know() {
        let (acc1, rej1, acc2) = (claim(A, 1), claim(R, 1), claim(A, 2));
        let delete = live(D, None, 1_800_000_000_000, &[]);
        for mine in [None, Some(&acc1), Some(&acc2), Some(&rej1)] {
            assert_eq!(shows(&[&acc1, &acc2, &delete], mine), Some((D, None)), "{mine:?}");
        }
        let accept = live(A, Some(1), 1_800_000_000_000, &[]);
        assert_eq!(shows(&[&rej1, &accept], Some(&rej1)), Some((R, Some(1))), "the rejecting master keeps it");
        assert_eq!(shows(&[&rej1, &accept], None), Some((A, Some(1))), "the others follow the live accept");
        assert!(unsettled(&entry(&[&rej1, &accept], None)));
        let knowing = live(A, Some(1), 1_800_000_000_001, &[&rej1]);
        assert_eq!(shows(&[&rej1, &knowing], Some(&rej1)), Some((A, Some(1))), "made knowing it: settled");
        assert!(!unsettled(&entry(&[&rej1, &knowing], None)));
        // Rejecting another key than the one accepted live is no exception.
        let accept2 = live(A, Some(2), 1_800_000_000_000, &[]);
        assert_eq!(shows(&[&rej1, &accept2], Some(&rej1)), Some((A, Some(2))));
    }
}
