//! The state store's contract: what every store behind [`Runtime`]'s store
//! effects must do, written once and run against each of them (the agent's
//! redb store on a temporary folder, and [`MemoryStore`], which the
//! simulation runs). A difference between them is a bug in one.
//!
//! A store implements [`ContractStore`] (the store effects of [`Runtime`],
//! what a start loads, and closing and opening it again), and its tests
//! call [`crate::store_contract_tests!`], which makes one `#[test]` per case
//! of [`cases`]. Each case checks what it wrote before and after the store
//! is reopened: what a store says must be what survives a restart.
//!
//! [`Runtime`]: crate::node::Runtime
//! [`MemoryStore`]: crate::node::testing::MemoryStore

use std::sync::Arc;

use crate::core::digest::{bucket_of, N_BUCKETS};
use crate::core::merge::Conflict;
use crate::core::version::LOGICAL_BITS;
use crate::core::{Context, Decision, Entry, MinionId, PublicKey, Relays, Seen, Verdict, Version};
use crate::node::{Failure, HeldDelete, Kept, Loaded, StoreWrite};

pub mod cases;

/// A state store under the contract.
pub trait ContractStore {
    /// A new, empty store, made at wall-clock `now_ms`.
    fn create(now_ms: u64) -> Self;
    /// [`crate::node::Runtime::journal`].
    fn journal(&mut self, decisions: &[Decision]) -> Result<(), Failure>;
    /// [`crate::node::Runtime::record`].
    fn record(&mut self, write: &StoreWrite<'_>) -> Result<(), Failure>;
    /// What a start loads.
    fn load(&mut self) -> Result<Loaded, Failure>;
    /// [`crate::node::Runtime::load`].
    fn get(&mut self, ids: &[MinionId]) -> Result<Vec<Decision>, Failure>;
    /// [`crate::node::Runtime::load_cold`].
    fn cold(&mut self, ids: &[MinionId]) -> Result<Vec<(MinionId, Entry)>, Failure>;
    /// [`crate::node::Runtime::cold_in`].
    fn cold_in(&mut self, buckets: &[u32]) -> Result<Vec<(MinionId, Version)>, Failure>;
    /// [`crate::node::Runtime::compact`].
    fn compact(&mut self, before_ms: u64, max: usize) -> Result<Vec<(MinionId, Version)>, Failure>;
    /// Records when the store started afresh (`recover --from-peers`).
    fn set_afresh(&mut self, hlc: u64) -> Result<(), Failure>;
    /// Closes the store and opens it again, as a restart does.
    fn reopen(&mut self);
}

/// One `#[test]` per case of the store contract, for the store type given
/// (a [`ContractStore`]).
#[macro_export]
macro_rules! store_contract_tests {
    ($store:ty) => {
        $crate::store_contract_tests!(@cases $store;
            a_new_store_holds_nothing_and_started_afresh_when_made,
            the_journal_keeps_decisions_being_applied_until_done,
            a_decision_is_kept_whole_with_what_was_seen_beside_it,
            a_decision_keeps_a_context_longer_than_255_versions,
            each_decision_written_replaces_what_was_kept_beside_it,
            kept_alone_changes_only_what_is_kept_beside_the_decision,
            claims_stay_known_with_their_keys,
            plain_tombstones_stay_in_the_store_and_are_read_back_cold,
            compaction_forgets_old_plain_tombstones_only,
            compaction_notes_per_origin_the_newest_delete_forgotten,
            held_deletes_are_kept_until_settled,
            conflicts_are_kept_until_told,
            the_clock_the_first_start_and_the_contact_are_kept,
            the_keys_being_put_back_are_kept,
        );
    };
    (@cases $store:ty; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::testkit::store_contract::cases::$case::<$store>();
            }
        )*
    };
}

/// What a start loads, in one order (the contract leaves the order of
/// `untold`, `forgot` and `held` to the store), to compare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub entries: Vec<(MinionId, Entry)>,
    pub cold: Vec<u32>,
    pub journal: Vec<Decision>,
    pub clock: u64,
    pub initialized: bool,
    pub untold: Vec<(crate::PeerName, Conflict)>,
    pub held: Vec<HeldDelete>,
    pub last_contact_ms: Option<u64>,
    pub forgot: Vec<(Arc<str>, u64)>,
    pub afresh: u64,
    pub putting_back: Vec<MinionId>,
}

impl View {
    pub fn of(loaded: Loaded) -> View {
        let mut view = View {
            entries: loaded.entries,
            cold: loaded.cold,
            journal: loaded.journal,
            clock: loaded.clock,
            initialized: loaded.initialized,
            untold: loaded.untold,
            held: loaded.held,
            last_contact_ms: loaded.last_contact_ms,
            forgot: loaded.forgot,
            afresh: loaded.afresh,
            putting_back: loaded.putting_back,
        };
        view.entries.sort_by(|a, b| a.0.cmp(&b.0));
        view.journal.sort_by(|a, b| a.id.cmp(&b.id));
        view.untold.sort_by_key(|a| conflict_key(&a.1));
        view.held.sort_by(|a, b| a.decision.id.cmp(&b.decision.id));
        view.forgot.sort();
        view
    }

    /// The plain tombstones counted, all buckets.
    pub fn n_cold(&self) -> u32 {
        self.cold.iter().sum()
    }

    pub fn entry(&self, id: &MinionId) -> Option<&Entry> {
        self.entries.iter().find(|(i, _)| i == id).map(|(_, e)| e)
    }
}

/// A conflict's identity: one per id and pair of decisions.
fn conflict_key(conflict: &Conflict) -> (MinionId, Version, Version) {
    (conflict.id.clone(), conflict.winner.version.clone(), conflict.loser.version.clone())
}

/// Runs `check` on the store, then again after it is reopened.
pub fn now_and_after_reopening<S: ContractStore>(store: &mut S, check: impl Fn(&mut S)) {
    check(store);
    store.reopen();
    check(store);
}

/// What a start loads, in one order; panics on a failure (none is expected).
pub fn view<S: ContractStore>(store: &mut S) -> View {
    View::of(store.load().expect("load"))
}

/// The known decisions of `ids`, by version.
pub fn get<S: ContractStore>(store: &mut S, ids: &[&MinionId]) -> Vec<Decision> {
    let ids: Vec<MinionId> = ids.iter().map(|&id| id.clone()).collect();
    let mut found = store.get(&ids).expect("get");
    found.sort_by(|a, b| (&a.id, &a.version).cmp(&(&b.id, &b.version)));
    found
}

/// The plain tombstones of `buckets`, by id.
pub fn cold_in<S: ContractStore>(store: &mut S, buckets: &[u32]) -> Vec<(MinionId, Version)> {
    let mut found = store.cold_in(buckets).expect("cold_in");
    found.sort();
    found
}

/// Every bucket.
pub fn all_buckets() -> Vec<u32> {
    (0..N_BUCKETS as u32).collect()
}

pub fn bucket(id: &MinionId) -> u32 {
    bucket_of(id) as u32
}

/// Writes one commit; panics on a failure (none is expected).
pub fn record<S: ContractStore>(store: &mut S, write: StoreWrite<'_>) {
    store.record(&write).expect("record");
}

pub fn id(name: &str) -> MinionId {
    MinionId::parse(name).expect("a valid id")
}

/// A public key's bytes (the store keeps them as they are): `n` tells them apart.
pub fn key(n: u8) -> PublicKey {
    let mut bytes = super::PUB.as_bytes().to_vec();
    bytes.push(n);
    PublicKey::new(bytes)
}

/// The wall-clock time the cases count from: their versions are live
/// ones, far above the claims' range.
pub const T0_MS: u64 = 1_600_000_000_000;

/// `t` milliseconds after [`T0_MS`].
pub fn ms(t: u64) -> u64 {
    T0_MS + t
}

/// A version issued `t` ms after [`T0_MS`] by `node`.
pub fn at(t: u64, node: &str) -> Version {
    Version::new(ms(t) << LOGICAL_BITS, node)
}

pub fn decision(id: &MinionId, verdict: Verdict, version: Version) -> Decision {
    Decision {
        id: id.clone(),
        verdict,
        version,
        context: Context::default(),
        relays: Relays::default(),
        reached: Relays::default(),
    }
}

pub fn accepted(id: &MinionId, key: &PublicKey, t: u64, node: &str) -> Decision {
    decision(id, Verdict::Accepted(key.clone()), at(t, node))
}

pub fn deleted(id: &MinionId, t: u64, node: &str) -> Decision {
    decision(id, Verdict::Deleted, at(t, node))
}

/// A claim of `key` (accepted or rejected) for `id`.
pub fn claim(id: &MinionId, rejected: bool, key: &PublicKey) -> Decision {
    let verdict = if rejected { Verdict::Rejected(key.clone()) } else { Verdict::Accepted(key.clone()) };
    decision(id, verdict, Version::claim(rejected, &key.fingerprint().0))
}

pub fn kept(id: &MinionId, seen: Vec<Seen>, mine: Option<Version>) -> Kept {
    Kept { id: id.clone(), seen, mine }
}

/// What a start loads for a decision held with `seen` and `mine`.
pub fn entry(decision: &Decision, seen: Vec<Seen>, mine: Option<Version>) -> Entry {
    decision.entry().with_seen(seen).with_mine(mine)
}
