//! The replica's entries by id, laid out densely: the entries in a vector
//! kept in chunks and, to find them, a hash table of their positions (4
//! bytes a slot).
//!
//! A `HashMap<MinionId, Entry>` keeps its 88-byte slots in a table of a
//! power-of-two size at most 7/8 full: 1,000,000 ids took 2,097,152 slots,
//! 187 MB, for 88 MB of entries. Here the entries take the chunks of 16,384
//! they fill (a first start reserves what it found), a new chunk when full
//! that moves nothing (`chunked.rs`), and the table's spare slots are 5
//! bytes each.
//!
//! Each entry's digest bucket is kept beside it (2 bytes): a peer's whole
//! fetch or Diff answer picks the entries of some buckets out of all of
//! them, and hashing every id with SHA-256 for it was half the CPU of a
//! master serving a join of 1,000,000 keys.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;

use super::chunked::Chunked;
use super::{bucket_of, Entry, MinionId};
use crate::core::observe::FileToken;

pub(super) struct Entries {
    slots: Chunked<(MinionId, Entry)>,
    /// Each slot's digest bucket (`bucket_of` of its id), in step with `slots`.
    buckets: Chunked<u16>,
    /// Each slot's file as a scan last read it and decided nothing
    /// (`FileToken`), in step with `slots`: forgotten when its entry changes.
    tokens: Chunked<Option<FileToken>>,
    /// Positions in `slots`, hashed by their ids.
    index: HashTable<u32>,
    /// Seeded per process, as `HashMap`'s: ids come from peers and from
    /// folders another user writes.
    hasher: RandomState,
}

impl Default for Entries {
    fn default() -> Entries {
        Entries {
            slots: Chunked::default(),
            buckets: Chunked::default(),
            tokens: Chunked::default(),
            index: HashTable::new(),
            hasher: RandomState::new(),
        }
    }
}

impl std::fmt::Debug for Entries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Entries {
    fn position<Q>(&self, id: &Q) -> Option<usize>
    where
        MinionId: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Nothing to hash for: a first start asks about every name before
        // it holds any.
        if self.is_empty() {
            return None;
        }
        let slots = &self.slots;
        self.index.find(self.hasher.hash_one(id), |&at| slots[at as usize].0.borrow() == id).map(|&at| at as usize)
    }

    pub fn get<Q>(&self, id: &Q) -> Option<&Entry>
    where
        MinionId: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.position(id).map(|at| &self.slots[at].1)
    }

    pub fn contains_key<Q>(&self, id: &Q) -> bool
    where
        MinionId: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.position(id).is_some()
    }

    /// Holds `entry` for `id`, returning the entry it replaces.
    pub fn insert(&mut self, id: MinionId, entry: Entry) -> Option<Entry> {
        // Hashed once, to look and to place.
        let hash = self.hasher.hash_one(&id);
        let slots = &self.slots;
        if let Some(&at) = self.index.find(hash, |&at| slots[at as usize].0 == id) {
            self.tokens[at as usize] = None;
            return Some(std::mem::replace(&mut self.slots[at as usize].1, entry));
        }
        let at = u32::try_from(self.slots.len()).expect("fewer than 2^32 ids held");
        self.buckets.push(u16::try_from(bucket_of(&id)).expect("buckets fit 16 bits"));
        self.tokens.push(None);
        self.slots.push((id, entry));
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.insert_unique(hash, at, |&at| hasher.hash_one(&slots[at as usize].0));
        None
    }

    /// Forgets `id`, returning its entry. The last entry takes its place.
    pub fn remove(&mut self, id: &MinionId) -> Option<Entry> {
        let slots = &self.slots;
        let found = self.index.find_entry(self.hasher.hash_one(id), |&at| slots[at as usize].0 == *id).ok()?;
        let at = found.remove().0 as usize;
        let last = self.slots.len() - 1;
        if at != last {
            let moved = self.hasher.hash_one(&self.slots[last].0);
            let slot = self.index.find_mut(moved, |&other| other as usize == last).expect("every entry is indexed");
            *slot = at as u32;
        }
        self.buckets.swap_remove(at);
        self.tokens.swap_remove(at);
        Some(self.slots.swap_remove(at).1)
    }

    /// The file a scan last read for `id` and decided nothing on, if its
    /// entry did not change since.
    pub fn token<Q>(&self, id: &Q) -> Option<FileToken>
    where
        MinionId: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.position(id).and_then(|at| self.tokens[at])
    }

    /// Keeps `token` with `id`'s entry (nothing when none is held).
    pub fn set_token<Q>(&mut self, id: &Q, token: Option<FileToken>)
    where
        MinionId: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(at) = self.position(id) {
            self.tokens[at] = token;
        }
    }

    /// Forgets every token: each file is read again by the next scan.
    pub fn forget_tokens(&mut self) {
        for at in 0..self.tokens.len() {
            self.tokens[at] = None;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&MinionId, &Entry)> + Clone {
        self.slots.iter().map(|(id, entry)| (id, entry))
    }

    /// The entries with their digest buckets.
    pub fn with_buckets(&self) -> impl Iterator<Item = (usize, &MinionId, &Entry)> + Clone {
        self.buckets.iter().zip(self.slots.iter()).map(|(&bucket, (id, entry))| (usize::from(bucket), id, entry))
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.len() == 0
    }

    /// Room for `additional` more ids: the chunks they need (growing moves
    /// nothing, so no more than that), and the table's room.
    pub fn reserve(&mut self, additional: usize) {
        self.slots.reserve(additional);
        self.buckets.reserve(additional);
        self.tokens.reserve(additional);
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.reserve(additional, |&at| hasher.hash_one(&slots[at as usize].0));
    }

    /// Ids there is room for without growing.
    pub fn capacity(&self) -> usize {
        self.slots.capacity().min(self.slots.len() + (self.index.capacity() - self.index.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Context, VerdictKind, Version};

    fn entry(hlc: u64) -> Entry {
        Entry::new(VerdictKind::Accepted, None, Version::new(hlc, "a"), Context::default())
    }

    fn id(n: usize) -> MinionId {
        MinionId::parse(&format!("web{n:03}")).unwrap()
    }

    #[test]
    fn entries_are_found_replaced_and_removed_as_in_a_map() {
        let mut entries = Entries::default();
        let mut model = std::collections::HashMap::new();
        for n in 0..200 {
            assert_eq!(entries.insert(id(n), entry(n as u64)), None);
            model.insert(id(n), entry(n as u64));
        }
        assert_eq!(entries.insert(id(7), entry(1000)), Some(entry(7)));
        model.insert(id(7), entry(1000));
        // Removing moves the last entry into the hole: every id stays found.
        for n in (0..200).step_by(3) {
            assert_eq!(entries.remove(&id(n)), model.remove(&id(n)));
            assert_eq!(entries.remove(&id(n)), None);
        }
        assert_eq!(entries.len(), model.len());
        for n in 0..200 {
            assert_eq!(entries.get(&id(n)), model.get(&id(n)), "web{n:03}");
            assert_eq!(entries.contains_key(id(n).as_str()), model.contains_key(&id(n)));
        }
        let mut listed: Vec<_> = entries.iter().map(|(id, e)| (id.clone(), e.clone())).collect();
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        let mut expected: Vec<_> = model.into_iter().collect();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(listed, expected);
        assert!(entries.with_buckets().all(|(bucket, id, _)| bucket == bucket_of(id)));
        loop {
            let Some(first) = entries.iter().next().map(|(id, _)| id.clone()) else { break };
            entries.remove(&first).unwrap();
        }
        assert!(entries.is_empty());
    }

    /// Each token stays with its id's entry while the entry does: the
    /// last entry moved into a removed one's place takes its token along,
    /// and an entry replaced (or removed and held again) has none.
    #[test]
    fn a_token_stays_with_its_entry_until_the_entry_changes() {
        use crate::core::{FileToken, Folder};
        let token = |n: usize| Some(FileToken::new(Folder::Accepted, (n as u64) << 2));
        let mut entries = Entries::default();
        for n in 0..10 {
            entries.insert(id(n), entry(n as u64));
            entries.set_token(&id(n), token(n));
        }
        // web009, the last, moves into web003's place.
        entries.remove(&id(3));
        assert_eq!(entries.token(&id(9)), token(9));
        assert_eq!(entries.token(&id(3)), None);
        entries.insert(id(3), entry(3));
        assert_eq!(entries.token(&id(3)), None, "held again: no token");
        // Replaced with the same entry: still a change of the entry.
        entries.insert(id(5), entry(5));
        assert_eq!(entries.token(&id(5)), None);
        assert_eq!(entries.token(id(4).as_str()), token(4), "found by name too");
        entries.set_token(&id(42), token(42));
        assert_eq!(entries.token(&id(42)), None, "an id not held keeps none");
        entries.forget_tokens();
        assert!((0..10).all(|n| entries.token(&id(n)).is_none()));
    }

    #[test]
    fn room_reserved_is_room_for_that_many_and_no_more() {
        use super::super::chunked::CHUNK;
        let mut entries = Entries::default();
        entries.reserve(100_000);
        let room = entries.slots.capacity();
        assert!((100_000..100_000 + CHUNK).contains(&room), "room for {room}");
        assert!(entries.capacity() >= 100_000);
        for n in 0..100_000 {
            entries.insert(MinionId::parse(&format!("m{n}")).unwrap(), entry(1));
        }
        // Filling what was reserved took no more room.
        assert_eq!(entries.slots.capacity(), room);
        for n in entries.len()..=room {
            entries.insert(MinionId::parse(&format!("n{n}")).unwrap(), entry(1));
        }
        assert_eq!(entries.slots.capacity(), room + CHUNK, "grown by one chunk");
        assert_eq!(entries.buckets.capacity(), entries.slots.capacity());
    }
}
