//! Key decisions: what the cluster agrees on about one minion id.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::causal::{Context, Seen};
use super::id::MinionId;
use super::version::Version;

/// sha256 of a key file's exact bytes, as `salt-key -F` prints it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub fn of(bytes: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(bytes).into())
    }
}

/// `aa:bb:…`, as `salt-key -F` prints it: written whole, one `write_str`
/// (a `write!` per byte was 6 % of a first start's CPU, every claim's
/// fingerprint written for the inventory).
impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = [b':'; 32 * 3 - 1];
        for (i, byte) in self.0.iter().enumerate() {
            text[3 * i] = HEX[usize::from(byte >> 4)];
            text[3 * i + 1] = HEX[usize::from(byte & 0xf)];
        }
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", &self.to_string()[..11])
    }
}

/// A minion public key: the bytes exactly as found (never normalised, the
/// fingerprint depends on every byte) and their fingerprint.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    bytes: Arc<[u8]>,
    fingerprint: Fingerprint,
}

impl PublicKey {
    /// Wraps bytes that already passed [`super::keyfile::check_public_key`].
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> PublicKey {
        let bytes = bytes.into();
        let fingerprint = Fingerprint::of(&bytes);
        PublicKey { bytes, fingerprint }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({:?})", self.fingerprint)
    }
}

/// The kind of a decision, without its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VerdictKind {
    Accepted,
    Rejected,
    Deleted,
}

impl VerdictKind {
    /// The audit action name of a decision of this kind.
    pub fn action(self) -> &'static str {
        match self {
            VerdictKind::Accepted => "accept",
            VerdictKind::Rejected => "reject",
            VerdictKind::Deleted => "delete",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accepted(PublicKey),
    Rejected(PublicKey),
    /// A tombstone: the id is in none of the three folders.
    Deleted,
}

impl Verdict {
    pub fn kind(&self) -> VerdictKind {
        match self {
            Verdict::Accepted(_) => VerdictKind::Accepted,
            Verdict::Rejected(_) => VerdictKind::Rejected,
            Verdict::Deleted => VerdictKind::Deleted,
        }
    }

    pub fn key(&self) -> Option<&PublicKey> {
        match self {
            Verdict::Accepted(key) | Verdict::Rejected(key) => Some(key),
            Verdict::Deleted => None,
        }
    }

    pub fn fingerprint(&self) -> Option<Fingerprint> {
        self.key().map(PublicKey::fingerprint)
    }
}

/// One decision about one minion id, as made on its origin node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub id: MinionId,
    pub verdict: Verdict,
    pub version: Version,
    /// What the origin knew of the id's history when it decided (empty when
    /// nothing): tells concurrent decisions from successive ones.
    pub context: Context,
    /// The agents it passed through before reaching this one, origin
    /// excluded (as each forwarder reported it; only the last hop, the
    /// peer it came from, is authenticated here). Not part of the decision.
    pub relays: Relays,
    /// The agents it has been pushed to on its way here, as the peer it
    /// came from reported them: this node forwards it to none of them
    /// (`link::pushes_to`). Not part of the decision, and not stored.
    pub reached: Relays,
}

/// Most relays a decision lists (a path longer than any site).
pub const MAX_RELAYS: usize = 16;

/// Names of agents a decision passed through (provenance for the audit
/// log) or was pushed to (for forwarding), at most [`MAX_RELAYS`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Relays(Box<[Arc<str>]>);

impl Relays {
    pub fn new(names: impl IntoIterator<Item = Arc<str>>) -> Relays {
        Relays(names.into_iter().take(MAX_RELAYS).collect())
    }

    /// This path with `peer` (the one it arrived from) at its end, unless
    /// `peer` is the origin itself.
    pub fn then(&self, peer: &crate::PeerName, origin: &str) -> Relays {
        if peer.as_str() == origin || self.0.len() >= MAX_RELAYS {
            return self.clone();
        }
        Relays(self.0.iter().cloned().chain(std::iter::once(peer.as_arc().clone())).collect())
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|name| &**name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Decision {
    /// The entry a node holds for this decision, having seen nothing else.
    pub fn entry(&self) -> Entry {
        Entry::new(self.verdict.kind(), self.verdict.fingerprint(), self.version.clone(), self.context.clone())
    }

    /// This decision as kept for telling conflicts.
    pub fn seen(&self) -> Seen {
        Seen {
            version: self.version.clone(),
            kind: self.verdict.kind(),
            fingerprint: self.verdict.fingerprint(),
            context: self.context.clone(),
        }
    }
}

/// What a node keeps in memory about an id: the decision held without its
/// key bytes, which stay in the store (100,000 keys of ~450 bytes would not
/// fit the memory target), and the other decisions about it this node has
/// seen (for most ids none), to tell every conflict exactly once.
///
/// The decision's context, the other decisions seen and this master's own
/// claim are empty for most ids, and kept out of line when not: a map of
/// 100,000 entries is 72 bytes an entry smaller (6 MiB of a joining
/// master's peak).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: VerdictKind,
    pub fingerprint: Option<Fingerprint>,
    /// Never assigned once built: with `mine_held`, [`Entry::mine`] is this
    /// version (build another entry with [`Entry::new`] and `with_mine`).
    pub version: Version,
    history: Option<Box<History>>,
    /// This master's own claim is the decision held (`mine` is `version`):
    /// so for every key a first start found, which a boxed `History` made
    /// 56 bytes an id more (56 MB at 1,000,000 ids).
    mine_held: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct History {
    context: Context,
    /// Other decisions seen, oldest first, at most [`super::causal::MAX_SEEN`].
    /// Every claim about the id that this node knows is either held or here.
    seen: Box<[Seen]>,
    /// This master's own claim (what it held at its agent's first start), if
    /// it had one (see `claims.rs`).
    mine: Option<Version>,
}

static NO_CONTEXT: std::sync::LazyLock<Context> = std::sync::LazyLock::new(Context::default);

impl Entry {
    /// An entry holding one decision, having seen nothing else.
    pub fn new(kind: VerdictKind, fingerprint: Option<Fingerprint>, version: Version, context: Context) -> Entry {
        let mut entry = Entry { kind, fingerprint, version, history: None, mine_held: false };
        entry.edit(|history| history.context = context);
        entry
    }

    /// What the origin knew of the id's history when it made the decision held.
    pub fn context(&self) -> &Context {
        self.history.as_ref().map_or(&NO_CONTEXT, |h| &h.context)
    }

    /// Other decisions seen, oldest first, at most [`super::causal::MAX_SEEN`].
    /// Every claim about the id that this node knows is either held or here.
    pub fn seen(&self) -> &[Seen] {
        self.history.as_ref().map_or(&[], |h| &h.seen)
    }

    /// This master's own claim (what it held at its agent's first start), if
    /// it had one (see `claims.rs`).
    pub fn mine(&self) -> Option<&Version> {
        if self.mine_held {
            return Some(&self.version);
        }
        self.history.as_ref().and_then(|h| h.mine.as_ref())
    }

    /// This entry with `seen` as the other decisions seen.
    pub fn with_seen(mut self, seen: impl Into<Box<[Seen]>>) -> Entry {
        let seen = seen.into();
        self.edit(|history| history.seen = seen);
        self
    }

    /// This entry with `mine` as this master's own claim.
    pub fn with_mine(mut self, mine: Option<Version>) -> Entry {
        self.mine_held = mine.as_ref() == Some(&self.version);
        let out_of_line = mine.filter(|_| !self.mine_held);
        self.edit(|history| history.mine = out_of_line);
        self
    }

    /// Changes the out-of-line part, dropping it when it is left empty.
    fn edit(&mut self, change: impl FnOnce(&mut History)) {
        let mut history = self.history.take().map_or_else(History::default, |h| *h);
        change(&mut history);
        if !(history.context.is_empty() && history.seen.is_empty() && history.mine.is_none()) {
            self.history = Some(Box::new(history));
        }
    }

    /// Whether this entry is a plain tombstone (see [`is_plain_tombstone`]).
    pub fn is_plain_tombstone(&self) -> bool {
        is_plain_tombstone(self.kind, self.seen(), self.mine())
    }

    /// Whether the entry says the same thing as `verdict`, whatever its version.
    pub fn same_verdict(&self, verdict: &Verdict) -> bool {
        self.kind == verdict.kind() && self.fingerprint == verdict.fingerprint()
    }

    /// The decision held, as kept for telling conflicts.
    pub fn held(&self) -> Seen {
        Seen {
            version: self.version.clone(),
            kind: self.kind,
            fingerprint: self.fingerprint,
            context: self.context().clone(),
        }
    }

    /// The decision held, then every other decision seen.
    pub fn decisions(&self) -> impl Iterator<Item = Seen> + '_ {
        std::iter::once(self.held()).chain(self.seen().iter().cloned())
    }

    /// Everything this node knows of the id's history: what a decision it
    /// makes now knows.
    pub fn known(&self) -> Context {
        let mut known = self.context().clone();
        known.add(&self.version);
        for seen in self.seen() {
            known.join(&seen.context);
            known.add(&seen.version);
        }
        known
    }
}

/// A delete held with no claim known about its id (no claim seen, none of
/// this master's own): the id is in no folder here, and nothing about it can
/// come to be shown but a new decision. Plain tombstones stay in the store,
/// not in memory (`replica.rs`), are left out of the bucket digests (a master
/// holding one and a master holding nothing for the id agree: neither shows
/// a key) and are compacted after `tombstone_ttl`.
pub fn is_plain_tombstone(kind: VerdictKind, seen: &[Seen], mine: Option<&Version>) -> bool {
    kind == VerdictKind::Deleted && mine.is_none() && seen.iter().all(|s| !s.version.is_claim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_prints_as_salt_key_f_does() {
        // Every byte value, both nibbles, in each place.
        for start in 0..=255u8 {
            let bytes: [u8; 32] = std::array::from_fn(|i| start.wrapping_add((i as u8).wrapping_mul(37)));
            let want: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(Fingerprint(bytes).to_string(), want.join(":"));
        }
        assert_eq!(format!("{:?}", Fingerprint([0xab; 32])), "ab:ab:ab:ab");
        assert_eq!(format!("{:>100}", Fingerprint([0; 32])).len(), 95, "written as is, unpadded, as before");
    }

    #[test]
    fn an_entry_with_no_history_keeps_none_out_of_line() {
        assert!(std::mem::size_of::<Entry>() <= 72, "{} bytes", std::mem::size_of::<Entry>());
        let version = Version::new(7, "a");
        let plain = Entry::new(VerdictKind::Deleted, None, version.clone(), Context::default());
        assert!(plain.history.is_none() && plain.context().is_empty() && plain.seen().is_empty());
        let other = Seen {
            version: Version::new(5, "b"),
            kind: VerdictKind::Deleted,
            fingerprint: None,
            context: Context::default(),
        };
        let rich = plain.clone().with_seen(vec![other.clone()]).with_mine(Some(Version::new(3, "c")));
        assert_eq!((rich.seen(), rich.mine()), (&[other][..], Some(&Version::new(3, "c"))));
        // Emptied again, it is the plain entry again (entries compare equal).
        assert_eq!(rich.with_seen(Vec::new()).with_mine(None), plain);
        // A first start's entry: its claim is the decision held, told by a
        // flag and not kept out of line.
        let found = Entry::new(VerdictKind::Accepted, None, Version::claim(false, &[7; 32]), Context::default());
        let found = found.clone().with_mine(Some(found.version.clone()));
        assert!(found.history.is_none(), "{found:?}");
        assert_eq!(found.mine(), Some(&found.version));
        assert!(!found.is_plain_tombstone());
        // Another decision held later keeps the claim, out of line.
        let later = Entry::new(VerdictKind::Rejected, None, Version::new(9, "b"), Context::default())
            .with_mine(found.mine().cloned());
        assert_eq!(later.mine(), Some(&Version::claim(false, &[7; 32])));
        assert!(later.history.is_some());
        let known = Entry::new(VerdictKind::Deleted, None, version, Context::new([Version::new(1, "b")]));
        assert!(known.history.is_some() && known.context().knows(&Version::new(1, "b")));
    }
}
