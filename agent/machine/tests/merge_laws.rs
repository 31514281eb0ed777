//! Property tests of the merge rule and `Replica::commit`: whatever the order, grouping and
//! duplication of deliveries, every node ends holding the same decisions and digests, and
//! every pair of concurrent, disagreeing decisions it saw is told as a conflict exactly once.

use std::collections::{BTreeMap, BTreeSet};

use keysync_machine::core::digest::{bucket_of, Digests};
use keysync_machine::core::merge::{merge, MergeOutcome};
use keysync_machine::core::observe::Reading;
use keysync_machine::core::replica::{ObserveMode, Replica};
use keysync_machine::core::version::{Hlc, Version};
use keysync_machine::core::{claims, Context, Decision, MinionId, PublicKey, Seen, Verdict, VerdictKind};
use proptest::prelude::*;

/// `tmpab12cd34` is a valid minion id too (Salt 3008's temporary names look like it).
const IDS: [&str; 3] = ["web01", "db01", "tmpab12cd34"];
const NODES: [&str; 3] = ["a", "b", "c"];

/// Around when the generated decisions are made.
const BASE_MS: u64 = 1_700_000_000_000;
/// Ahead of every generated live version, so the skew bound never refuses one.
const WALL_MS: u64 = BASE_MS + 1_000;
const MAX_SKEW_MS: u64 = 0;

/// Two keys, plus the first without its trailing newline: a different fingerprint.
fn key(variant: u8) -> PublicKey {
    let body = [
        "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAu1SU1LfVLPHCozMxH2Mo",
        "4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u",
    ];
    let pem =
        format!("-----BEGIN PUBLIC KEY-----\n{}\nmwIDAQAB\n-----END PUBLIC KEY-----\n", body[usize::from(variant % 2)]);
    let bytes = if variant == 2 { pem.trim_end().as_bytes().to_vec() } else { pem.into_bytes() };
    PublicKey::new(bytes)
}

fn verdict(choice: u8) -> Verdict {
    match choice {
        0..=2 => Verdict::Accepted(key(choice)),
        3..=5 => Verdict::Rejected(key(choice - 3)),
        _ => Verdict::Deleted,
    }
}

/// `at` 0 to 2, for a key: a claim, found at some master's first start
/// (named by its content, whichever master and moment); above, or for a
/// delete: issued by a running node's clock at that millisecond.
fn version(at: u64, node: usize, verdict: &Verdict) -> Version {
    match (at, verdict) {
        (0..=2, Verdict::Accepted(key)) => Version::claim(false, &key.fingerprint().0),
        (0..=2, Verdict::Rejected(key)) => Version::claim(true, &key.fingerprint().0),
        _ => Version::new(Hlc::default().tick(BASE_MS + at), NODES[node]),
    }
}

/// One decision. What it knew is strictly below its own version, as the clock makes it
/// (every version seen is witnessed); a claim knew nothing.
fn decision() -> impl Strategy<Value = Decision> {
    let at = (0u64..=10, 0..NODES.len(), 0u8..7);
    (0..IDS.len(), at.clone(), prop::collection::vec(at, 0..3)).prop_map(|(id, (at, node, choice), knew)| {
        let verdict = verdict(choice);
        let version = version(at, node, &verdict);
        let context = if version.is_claim() {
            Context::default()
        } else {
            let knew = knew.into_iter().map(|(at, node, choice)| self::version(at, node, &self::verdict(choice)));
            Context::new(knew.filter(|v| *v < version))
        };
        Decision {
            id: MinionId::parse(IDS[id]).unwrap(),
            verdict,
            version,
            context,
            relays: Default::default(),
            reached: Default::default(),
        }
    })
}

/// Distinct decisions: a version names one decision, so a later draw with the
/// same id and version as an earlier one is dropped.
fn pool() -> impl Strategy<Value = Vec<Decision>> {
    prop::collection::vec(decision(), 1..14).prop_map(|raw| {
        let mut seen = BTreeMap::new();
        for d in raw {
            seen.entry((d.id.clone(), d.version.clone())).or_insert(d);
        }
        seen.into_values().collect()
    })
}

/// A pool and a delivery schedule: every decision at least once, some twice or more, shuffled.
fn pool_and_schedule() -> impl Strategy<Value = (Vec<Decision>, Vec<usize>)> {
    pool().prop_flat_map(|pool| {
        let n = pool.len();
        let extra = prop::collection::vec(0..n, 0..2 * n);
        let schedule = extra.prop_map(move |extra| (0..n).chain(extra).collect::<Vec<_>>()).prop_shuffle();
        (Just(pool), schedule)
    })
}

/// What a node holds, in a comparable form: per id the decision held, and the digests.
#[derive(Debug, PartialEq)]
struct State {
    entries: BTreeMap<MinionId, Seen>,
    digests: Digests,
}

/// Plain tombstones left out: a node holding one and a node holding nothing
/// for the id show the same, and are in the same digests.
fn state(replica: &Replica) -> State {
    let entries = replica
        .entries()
        .filter(|(_, entry)| !entry.is_plain_tombstone())
        .map(|(id, entry)| (id.clone(), entry.held()))
        .collect();
    State { entries, digests: replica.digests().clone() }
}

/// Conflicts as told: (id, winner version, loser version).
type Told = BTreeSet<(MinionId, Version, Version)>;

/// The node's path for a peer's decision: merge, then commit what is not a
/// duplicate (applied, or remembered); returns the outcome and what it told.
fn deliver_telling(replica: &mut Replica, decision: &Decision) -> (MergeOutcome, Told) {
    let merged = replica.merge(decision, WALL_MS, MAX_SKEW_MS).expect("versions are within the skew bound");
    if merged.outcome != MergeOutcome::Duplicate {
        replica.commit(decision);
    }
    let told = merged.conflicts.into_iter().map(|c| (c.id, c.winner.version, c.loser.version)).collect();
    (merged.outcome, told)
}

fn deliver(replica: &mut Replica, decision: &Decision) -> MergeOutcome {
    deliver_telling(replica, decision).0
}

fn deliver_all<'a>(node: &str, decisions: impl IntoIterator<Item = &'a Decision>) -> Replica {
    let mut replica = Replica::new(node, Hlc::default());
    for decision in decisions {
        deliver(&mut replica, decision);
    }
    replica
}

/// The expected result: per id, the decision with the highest version; the
/// digests cover it and every claim about the id.
fn expected(decisions: &[Decision]) -> State {
    let mut winners: BTreeMap<MinionId, &Decision> = BTreeMap::new();
    for d in decisions {
        let slot = winners.entry(d.id.clone()).or_insert(d);
        if d.version > slot.version {
            *slot = d;
        }
    }
    let mut replica = Replica::new("expected", Hlc::default());
    for (id, d) in &winners {
        let mut claims: Vec<Seen> = decisions
            .iter()
            .filter(|c| c.id == *id && c.version.is_claim() && c.version != d.version)
            .map(Decision::seen)
            .collect();
        claims.sort_by(|a, b| a.version.cmp(&b.version));
        claims.dedup_by(|a, b| a.version == b.version);
        replica.load(id.clone(), d.entry().with_seen(claims));
    }
    // As `state` gives it: without plain tombstones.
    let entries = winners
        .into_iter()
        .filter(|(id, _)| replica.entry(id).is_some_and(|e| !e.is_plain_tombstone()))
        .map(|(id, d)| (id, d.seen()))
        .collect();
    State { entries, digests: replica.digests().clone() }
}

/// Every pair of distinct decisions of `decisions` that conflict: two live
/// decisions made concurrently that disagree; two claims of different keys;
/// a claim rejecting the key a live decision accepted without knowing it.
fn conflicting_pairs(decisions: &[&Decision]) -> Told {
    let mut pairs = Told::new();
    for (i, a) in decisions.iter().enumerate() {
        for b in &decisions[i + 1..] {
            if a.id == b.id && a.version != b.version && conflict(a, b) {
                let (winner, loser) = if a.version > b.version { (a, b) } else { (b, a) };
                pairs.insert((a.id.clone(), winner.version.clone(), loser.version.clone()));
            }
        }
    }
    pairs
}

fn conflict(a: &Decision, b: &Decision) -> bool {
    let keeps_rejection = |claim: &Decision, live: &Decision| match (&claim.verdict, &live.verdict) {
        (Verdict::Rejected(rejected), Verdict::Accepted(accepted)) => {
            rejected == accepted && !live.context.iter().any(|v| *v == claim.version)
        }
        _ => false,
    };
    match (a.version.is_claim(), b.version.is_claim()) {
        (true, true) => a.verdict.fingerprint() != b.verdict.fingerprint(),
        (true, false) => keeps_rejection(a, b),
        (false, true) => keeps_rejection(b, a),
        (false, false) => concurrent(a, b) && a.verdict != b.verdict,
    }
}

/// The decisions of `pool` that `replica` holds or knows as claims: what it
/// would send a peer.
fn held<'a>(replica: &Replica, pool: &'a [Decision]) -> Vec<&'a Decision> {
    pool.iter()
        .filter(|d| {
            replica.entry(&d.id).is_some_and(|entry| {
                entry.version == d.version
                    || (d.version.is_claim() && entry.seen().iter().any(|s| s.version == d.version))
            })
        })
        .collect()
}

/// What the digests cover of an id: the decision held and every claim known
/// (nothing of a plain tombstone).
fn digested(replica: &Replica, id: &MinionId) -> Option<(Seen, Vec<Seen>)> {
    let entry = replica.entry(id).filter(|e| !e.is_plain_tombstone());
    entry.map(|e| (e.held(), e.seen().iter().filter(|s| s.version.is_claim()).cloned().collect()))
}

/// Ids the folders should show as accepted, counted afresh.
fn accepted(replica: &Replica) -> usize {
    replica
        .entries()
        .filter(|(_, entry)| claims::effective(entry).is_some_and(|s| s.kind == VerdictKind::Accepted))
        .count()
}

/// Concurrent: neither decision's origin had seen the other's version (or a later one of the
/// same node) when it decided.
fn concurrent(a: &Decision, b: &Decision) -> bool {
    let knew = |d: &Decision, other: &Decision| d.context.knows(&other.version);
    !knew(a, b) && !knew(b, a)
}

/// Pulls from `peer` exactly as a node does in anti-entropy: digests, differing buckets'
/// summaries, the ids newer on the peer, then everything the peer knows of them (the
/// decision held and the claims) through the merge path.
fn pull(node: &mut Replica, peer: &Replica, peer_store: &[Decision]) {
    let buckets = peer.digests().differing(node.digests().as_slice());
    // Plain tombstones go only where the node holds something (`Node::diff`).
    let tombstones: Vec<u32> =
        buckets.iter().copied().filter(|&b| node.digests().as_slice()[b as usize] != 0).collect();
    let summaries = peer.summaries_in(&buckets, &tombstones, Vec::new());
    let mut newer: Vec<MinionId> =
        summaries.iter().filter(|(id, theirs)| node.is_newer_on_peer(id, theirs)).map(|(id, _)| id.clone()).collect();
    newer.dedup();
    for id in newer {
        for decision in held(peer, peer_store).into_iter().filter(|d| d.id == id) {
            deliver(node, decision);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Commutative and idempotent: any order, any duplicates, through merge or straight to
    /// commit, gives the highest version per id and the digests of exactly those entries.
    #[test]
    fn any_delivery_order_gives_the_highest_versions((pool, schedule) in pool_and_schedule()) {
        let want = expected(&pool);
        let in_order = deliver_all("x", &pool);
        let scheduled = deliver_all("y", schedule.iter().map(|&i| &pool[i]));
        let mut committed = Replica::new("z", Hlc::default());
        for &i in schedule.iter().rev() {
            committed.commit(&pool[i]);
        }
        prop_assert_eq!(&state(&in_order), &want);
        prop_assert_eq!(&state(&scheduled), &want);
        prop_assert_eq!(&state(&committed), &want);
        for replica in [&in_order, &scheduled, &committed] {
            prop_assert_eq!(replica.n_accepted(), accepted(replica), "the count kept is the count");
        }
    }

    /// Delivering again what a node already holds changes nothing and merges as a duplicate.
    #[test]
    fn redelivery_is_a_duplicate((pool, schedule) in pool_and_schedule()) {
        let mut replica = deliver_all("x", schedule.iter().map(|&i| &pool[i]));
        let before = state(&replica);
        for d in held(&replica, &pool) {
            prop_assert_eq!(deliver(&mut replica, d), MergeOutcome::Duplicate);
        }
        for d in &pool {
            replica.commit(d);
        }
        prop_assert_eq!(state(&replica), before);
    }

    /// Associative: merging the states of (A+B) then C equals A then (B+C), where a state
    /// travels as the decisions it holds.
    #[test]
    fn grouping_does_not_matter(pool in pool(), groups in prop::collection::vec(0u8..3, 14)) {
        let group = |g: u8| pool.iter().zip(&groups).filter(move |(_, &k)| k == g).map(|(d, _)| d);
        let ab = deliver_all("ab", group(0).chain(group(1)));
        let ab_c = deliver_all("ab_c", held(&ab, &pool).into_iter().chain(group(2)));
        let bc = deliver_all("bc", group(1).chain(group(2)));
        let a_bc = deliver_all("a_bc", group(0).chain(held(&bc, &pool)));
        prop_assert_eq!(state(&ab_c), state(&a_bc));
        prop_assert_eq!(state(&ab_c), expected(&pool));
    }

    /// The outcome follows the versions alone; a conflict is told exactly when the two
    /// decisions are concurrent and disagree, the same one from both sides, naming the higher
    /// version the winner.
    #[test]
    fn conflicts_are_concurrent_disagreements(a in decision(), b in decision()) {
        let b = Decision { id: a.id.clone(), ..b };
        prop_assume!(a.version != b.version);
        let want: Vec<(Version, Version)> = conflict(&a, &b)
            .then(|| (a.version.clone().max(b.version.clone()), a.version.clone().min(b.version.clone())))
            .into_iter()
            .collect();
        for (held, incoming) in [(&a, &b), (&b, &a)] {
            let merged = merge(Some(&held.entry()), incoming);
            let outcome = if incoming.version > held.version { MergeOutcome::Apply } else { MergeOutcome::Superseded };
            prop_assert_eq!(merged.outcome, outcome);
            let told: Vec<(Version, Version)> =
                merged.conflicts.into_iter().map(|c| (c.winner.version, c.loser.version)).collect();
            prop_assert_eq!(&told, &want);
        }
        prop_assert_eq!(merge(Some(&a.entry()), &a).outcome, MergeOutcome::Duplicate);
        prop_assert_eq!(merge(None, &a).outcome, MergeOutcome::Apply);
    }

    /// Exactly once: whatever the order and the repeats, a node that saw a set of decisions
    /// has told every pair of them that conflicts, each once, and nothing else.
    #[test]
    fn every_conflicting_pair_seen_is_told_once((pool, schedule) in pool_and_schedule()) {
        let mut replica = Replica::new("x", Hlc::default());
        let mut told: Vec<(MinionId, Version, Version)> = Vec::new();
        for &i in &schedule {
            told.extend(deliver_telling(&mut replica, &pool[i]).1);
        }
        let distinct: Told = told.iter().cloned().collect();
        prop_assert_eq!(told.len(), distinct.len(), "a conflict told twice: {:?}", told);
        let seen: Vec<&Decision> = pool.iter().collect();
        prop_assert_eq!(distinct, conflicting_pairs(&seen));
    }

    /// A claim never replaces a live decision as the one held, in any order.
    #[test]
    fn claims_never_beat_live((pool, schedule) in pool_and_schedule()) {
        let replica = deliver_all("x", schedule.iter().map(|&i| &pool[i]));
        for id in IDS.map(|id| MinionId::parse(id).unwrap()) {
            let live = pool.iter().filter(|d| d.id == id).any(|d| !d.version.is_claim());
            if live {
                prop_assert!(!replica.entry(&id).unwrap().version.is_claim(), "{id}: a claim won");
            }
        }
        for claim in pool.iter().filter(|d| d.version.is_claim()) {
            for live in pool.iter().filter(|d| d.id == claim.id && !d.version.is_claim()) {
                prop_assert_eq!(merge(Some(&live.entry()), claim).outcome, MergeOutcome::Superseded);
                prop_assert_eq!(merge(Some(&claim.entry()), live).outcome, MergeOutcome::Apply);
            }
        }
    }

    /// What a master shows (`claims::effective`) depends only on what it
    /// knows and its own claim, never on the order it learnt it in.
    #[test]
    fn what_a_master_shows_is_independent_of_the_order((pool, schedule) in pool_and_schedule(), mine in 0usize..14) {
        let in_order = deliver_all("x", &pool);
        let shuffled = deliver_all("x", schedule.iter().map(|&i| &pool[i]));
        let claims: Vec<&Decision> = pool.iter().filter(|d| d.version.is_claim()).collect();
        for id in IDS.map(|id| MinionId::parse(id).unwrap()) {
            let own = claims.iter().filter(|c| c.id == id).nth(mine % 3).map(|c| c.version.clone());
            let shows = |replica: &Replica| {
                replica.entry(&id).and_then(|e| claims::effective(&e.clone().with_mine(own.clone())))
            };
            prop_assert_eq!(shows(&in_order), shows(&shuffled), "{}", id);
        }
    }

    /// Masters that held the same key, whenever and wherever, hold one and
    /// the same claim; any live decision beats it, whatever the wall clocks say.
    #[test]
    fn a_claim_names_its_content(
        ms in (0u64..BASE_MS, 0u64..BASE_MS),
        live_ms in any::<u64>().prop_map(|ms| ms % (2 * BASE_MS)),
        nodes in (0..NODES.len(), 0..NODES.len(), 0..NODES.len()),
        choices in (0u8..6, 0u8..6),
    ) {
        let id = MinionId::parse(IDS[0]).unwrap();
        let first_start = |node: usize, choice: u8, wall_ms: u64| {
            let mut replica = Replica::new(NODES[node], Hlc::default());
            let seen = Reading::Decided(verdict(choice));
            replica.observe(&id, seen, wall_ms, ObserveMode::FirstStart).expect("a key file is a claim")
        };
        let one = first_start(nodes.0, choices.0, ms.0);
        let other = first_start(nodes.1, choices.1, ms.1);
        prop_assert!(one.version.is_claim() && other.version.is_claim());
        prop_assert_eq!(one.version == other.version, one.verdict == other.verdict);

        let mut running = Replica::new(NODES[nodes.2], Hlc::default());
        let live = running.observe(&id, Reading::Decided(Verdict::Accepted(key(0))), live_ms, ObserveMode::Live).unwrap();
        prop_assert!(!live.version.is_claim());
        for claim in [&one, &other] {
            prop_assert_eq!(merge(Some(&claim.entry()), &live).outcome, MergeOutcome::Apply);
        }
    }

    /// Digests differ exactly in the buckets where the entries differ, and one anti-entropy
    /// pull each way leaves both nodes identical.
    #[test]
    fn anti_entropy_converges_in_one_exchange(pool in pool(), on_x in prop::collection::vec(any::<bool>(), 14), on_y in prop::collection::vec(any::<bool>(), 14)) {
        let subset = |mask: &[bool]| pool.iter().zip(mask).filter(|(_, &keep)| keep).map(|(d, _)| d.clone()).collect::<Vec<_>>();
        let (store_x, store_y) = (subset(&on_x), subset(&on_y));
        let mut x = deliver_all("x", &store_x);
        let mut y = deliver_all("y", &store_y);

        let mut want_buckets: Vec<u32> = pool
            .iter()
            .map(|d| &d.id)
            .filter(|id| digested(&x, id) != digested(&y, id))
            .map(|id| bucket_of(id) as u32)
            .collect();
        want_buckets.sort();
        want_buckets.dedup();
        prop_assert_eq!(x.digests().differing(y.digests().as_slice()), want_buckets.clone());
        prop_assert_eq!(y.digests().differing(x.digests().as_slice()), want_buckets);

        pull(&mut x, &y, &store_y);
        let x_store: Vec<Decision> = held(&x, &pool).into_iter().cloned().collect();
        pull(&mut y, &x, &x_store);
        prop_assert_eq!((x.n_accepted(), y.n_accepted()), (accepted(&x), accepted(&y)));
        prop_assert_eq!(state(&x), state(&y));
        prop_assert!(x.digests().differing(y.digests().as_slice()).is_empty());
        let union: Vec<Decision> = store_x.iter().chain(&store_y).cloned().collect();
        prop_assert_eq!(state(&x), expected(&union));
    }
}
