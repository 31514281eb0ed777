//! The store's record layouts. A decision record is the decision held (with
//! its key) and the other decisions seen for its id; a journal record is a
//! decision alone; an untold conflict names its two decisions and the peer
//! it came from. Records written by 0.1 (one `supersedes` version, nothing
//! seen) are still read.
//!
//! Layout 2: `0x10`, kind u8, version, context, seen count u8, each seen
//! (version, kind u8, fingerprint, context), relay count u8, each relay (a
//! string), 0 or 1 and this master's own claim (a version), then the key
//! bytes. A version
//! is hlc u64 BE, node length u16 BE, node bytes; a context is a count u8
//! and that many versions; a fingerprint is 0, or 1 and 32 bytes.
//! Layout 3: `0x11`, then as layout 2 but every context's count is a u16 BE:
//! written only for a record with a context of more than 255 versions (one
//! per node and claim the decision knew; the wire lets 256 through), so
//! every other record stays readable by the builds that know layout 2 only.
//! Layout 1 (0.1): kind u8 (1–3), version, has_supersedes u8, [supersedes], key bytes.
//!
//! An untold conflict is the peer's name, the id and its two decisions; with
//! a context of more than 255 versions in either, it starts with `0x11` and
//! its contexts' counts are u16 BE (a name's length, first otherwise, is at
//! most 253: its first byte is 0).

use crate::core::merge::Conflict;
use crate::core::{Context, Decision, Fingerprint, MinionId, PublicKey, Relays, Seen, Verdict, VerdictKind, Version};
use keysync_machine::PeerName;

const LAYOUT_2: u8 = 0x10;
const LAYOUT_3: u8 = 0x11;
/// Versions a context of layout 2 holds at most.
const NARROW: usize = u8::MAX as usize;

/// What the store keeps for one id: the decision held, the others seen and
/// this master's own claim (see `claims.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub decision: Decision,
    pub seen: Vec<Seen>,
    pub mine: Option<Version>,
}

impl Record {
    /// Whether it is a plain tombstone (kept out of memory: `node/cold.rs`).
    pub fn is_plain_tombstone(&self) -> bool {
        crate::core::decision::is_plain_tombstone(self.decision.verdict.kind(), &self.seen, self.mine.as_ref())
    }

    /// Its id, and what the replica holds for it.
    pub fn into_entry(self) -> (crate::core::MinionId, crate::core::Entry) {
        let entry = self.decision.entry().with_seen(self.seen).with_mine(self.mine);
        (self.decision.id, entry)
    }
}

pub fn encode_record(decision: &Decision, seen: &[Seen], mine: Option<&Version>) -> Vec<u8> {
    let key = decision.verdict.key().map(PublicKey::bytes).unwrap_or_default();
    let mut out = Vec::with_capacity(64 + key.len() + seen.len() * 64);
    let wide = decision.context.len() > NARROW || seen.iter().any(|s| s.context.len() > NARROW);
    out.push(if wide { LAYOUT_3 } else { LAYOUT_2 });
    out.push(kind_byte(decision.verdict.kind()));
    encode_version(&mut out, &decision.version);
    encode_context(&mut out, &decision.context, wide);
    // At most `causal::MAX_SEEN` (64).
    out.push(seen.len().min(usize::from(u8::MAX)) as u8);
    for s in seen.iter().take(usize::from(u8::MAX)) {
        encode_seen(&mut out, s, wide);
    }
    let relays: Vec<&str> = decision.relays.iter().collect();
    out.push(relays.len().min(usize::from(u8::MAX)) as u8);
    for relay in relays.iter().take(usize::from(u8::MAX)) {
        encode_str(&mut out, relay);
    }
    match mine {
        Some(mine) => {
            out.push(1);
            encode_version(&mut out, mine);
        }
        None => out.push(0),
    }
    out.extend_from_slice(key);
    out
}

pub fn decode_record(id: &str, bytes: &[u8]) -> Option<Record> {
    let id = MinionId::parse(id).ok()?;
    let (&first, rest) = bytes.split_first()?;
    let wide = match first {
        LAYOUT_2 => false,
        LAYOUT_3 => true,
        _ => return decode_layout_1(id, bytes).map(|decision| Record { decision, seen: Vec::new(), mine: None }),
    };
    let (&kind, rest) = rest.split_first()?;
    let (version, rest) = decode_version(rest)?;
    let (context, rest) = decode_context(rest, wide)?;
    let (&n_seen, mut rest) = rest.split_first()?;
    let mut seen = Vec::with_capacity(usize::from(n_seen));
    for _ in 0..n_seen {
        let (s, after) = decode_seen(rest, wide)?;
        seen.push(s);
        rest = after;
    }
    let (&n_relays, mut rest) = rest.split_first()?;
    let mut relays = Vec::with_capacity(usize::from(n_relays));
    for _ in 0..n_relays {
        let (relay, after) = decode_str(rest)?;
        relays.push(crate::core::version::node_name(relay));
        rest = after;
    }
    let (&has_mine, mut rest) = rest.split_first()?;
    let mine = match has_mine {
        0 => None,
        1 => {
            let (mine, after) = decode_version(rest)?;
            rest = after;
            Some(mine)
        }
        _ => return None,
    };
    let verdict = verdict_of(kind, rest)?;
    let decision = Decision { id, verdict, version, context, relays: Relays::new(relays), reached: Relays::default() };
    Some(Record { decision, seen, mine })
}

/// A 0.1 record: its `supersedes` is its whole context.
fn decode_layout_1(id: MinionId, bytes: &[u8]) -> Option<Decision> {
    let (&kind, rest) = bytes.split_first()?;
    let (version, rest) = decode_version(rest)?;
    let (&has_supersedes, mut rest) = rest.split_first()?;
    let mut context = Context::default();
    if has_supersedes == 1 {
        let (supersedes, after) = decode_version(rest)?;
        context.add(&supersedes);
        rest = after;
    }
    let verdict = verdict_of(kind, rest)?;
    Some(Decision { id, verdict, version, context, relays: Default::default(), reached: Default::default() })
}

/// An untold conflict: the peer it came from, the id, winner and loser.
pub fn encode_conflict(from: &str, conflict: &Conflict) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let wide = [&conflict.winner, &conflict.loser].iter().any(|s| s.context.len() > NARROW);
    if wide {
        out.push(LAYOUT_3);
    }
    encode_str(&mut out, from);
    encode_str(&mut out, conflict.id.as_str());
    encode_seen(&mut out, &conflict.winner, wide);
    encode_seen(&mut out, &conflict.loser, wide);
    out
}

/// The peer's name is not checked again: this store kept it (see [`PeerName::trusted`]).
pub fn decode_conflict(bytes: &[u8]) -> Option<(PeerName, Conflict)> {
    let (wide, bytes) = match bytes.split_first()? {
        (&LAYOUT_3, rest) => (true, rest),
        _ => (false, bytes),
    };
    let (from, rest) = decode_str(bytes)?;
    let (id, rest) = decode_str(rest)?;
    let (winner, rest) = decode_seen(rest, wide)?;
    let (loser, rest) = decode_seen(rest, wide)?;
    let id = MinionId::parse(id).ok()?;
    rest.is_empty().then(|| (PeerName::trusted(from), Conflict { id, winner, loser }))
}

/// A delete the guard holds: the peer it came from, when it was held
/// (wall-clock ms, u64 BE), then the decision as a decision record.
pub fn encode_held(held: &keysync_machine::node::HeldDelete) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    encode_str(&mut out, held.from.as_str());
    out.extend_from_slice(&held.since_ms.to_be_bytes());
    out.extend_from_slice(&encode_record(&held.decision, &[], None));
    out
}

pub fn decode_held(id: &str, bytes: &[u8]) -> Option<keysync_machine::node::HeldDelete> {
    let (from, rest) = decode_str(bytes)?;
    let (since, rest) = rest.split_first_chunk::<8>()?;
    let decision = decode_record(id, rest)?.decision;
    (decision.verdict == Verdict::Deleted).then(|| keysync_machine::node::HeldDelete {
        decision,
        from: PeerName::trusted(from),
        since_ms: u64::from_be_bytes(*since),
    })
}

/// The untold table's key for a conflict: one row per pair.
pub fn conflict_key(conflict: &Conflict) -> String {
    format!("{}\0{}\0{}", conflict.id, conflict.winner.version, conflict.loser.version)
}

fn kind_byte(kind: VerdictKind) -> u8 {
    match kind {
        VerdictKind::Accepted => 1,
        VerdictKind::Rejected => 2,
        VerdictKind::Deleted => 3,
    }
}

fn kind_of(byte: u8) -> Option<VerdictKind> {
    match byte {
        1 => Some(VerdictKind::Accepted),
        2 => Some(VerdictKind::Rejected),
        3 => Some(VerdictKind::Deleted),
        _ => None,
    }
}

fn verdict_of(kind: u8, key: &[u8]) -> Option<Verdict> {
    Some(match kind_of(kind)? {
        VerdictKind::Accepted => Verdict::Accepted(PublicKey::new(key)),
        VerdictKind::Rejected => Verdict::Rejected(PublicKey::new(key)),
        VerdictKind::Deleted => Verdict::Deleted,
    })
}

fn encode_seen(out: &mut Vec<u8>, seen: &Seen, wide: bool) {
    encode_version(out, &seen.version);
    out.push(kind_byte(seen.kind));
    match seen.fingerprint {
        Some(fingerprint) => {
            out.push(1);
            out.extend_from_slice(&fingerprint.0);
        }
        None => out.push(0),
    }
    encode_context(out, &seen.context, wide);
}

fn decode_seen(bytes: &[u8], wide: bool) -> Option<(Seen, &[u8])> {
    let (version, rest) = decode_version(bytes)?;
    let (&kind, rest) = rest.split_first()?;
    let kind = kind_of(kind)?;
    let (&has_fingerprint, mut rest) = rest.split_first()?;
    let fingerprint = if has_fingerprint == 1 {
        let fingerprint = Fingerprint(rest.get(..32)?.try_into().ok()?);
        rest = &rest[32..];
        Some(fingerprint)
    } else {
        None
    };
    let (context, rest) = decode_context(rest, wide)?;
    Some((Seen { version, kind, fingerprint, context }, rest))
}

/// A context: its count (a u8, or a u16 BE when `wide`), then its versions.
fn encode_context(out: &mut Vec<u8>, context: &Context, wide: bool) {
    let max = if wide { usize::from(u16::MAX) } else { NARROW };
    let n = context.len().min(max);
    if wide {
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(n as u8);
    }
    for version in context.iter().take(n) {
        encode_version(out, version);
    }
}

fn decode_context(bytes: &[u8], wide: bool) -> Option<(Context, &[u8])> {
    let (n, mut rest) = if wide {
        let (n, rest) = bytes.split_first_chunk::<2>()?;
        (u16::from_be_bytes(*n), rest)
    } else {
        let (&n, rest) = bytes.split_first()?;
        (u16::from(n), rest)
    };
    let mut context = Context::default();
    for _ in 0..n {
        let (version, after) = decode_version(rest)?;
        context.add(&version);
        rest = after;
    }
    Some((context, rest))
}

fn encode_version(out: &mut Vec<u8>, version: &Version) {
    out.extend_from_slice(&version.hlc.to_be_bytes());
    encode_str(out, &version.node);
}

fn decode_version(bytes: &[u8]) -> Option<(Version, &[u8])> {
    let hlc = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
    let (node, rest) = decode_str(&bytes[8..])?;
    Some((Version { hlc, node: crate::core::version::node_name(node) }, rest))
}

fn encode_str(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u16).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn decode_str(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let len = usize::from(u16::from_be_bytes(bytes.get(..2)?.try_into().ok()?));
    let text = std::str::from_utf8(bytes.get(2..2 + len)?).ok()?;
    Some((text, &bytes[2 + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keysync_machine::testkit::PUB;

    fn decision(verdict: Verdict, hlc: u64, context: &[(u64, &str)]) -> Decision {
        Decision {
            id: MinionId::parse("web01").unwrap(),
            verdict,
            version: Version::new(hlc, "a"),
            context: Context::new(context.iter().map(|&(h, n)| Version::new(h, n))),
            relays: Default::default(),
            reached: Default::default(),
        }
    }

    fn key_fingerprint() -> [u8; 32] {
        PublicKey::new(PUB.as_bytes()).fingerprint().0
    }

    #[test]
    fn records_round_trip_with_what_was_seen() {
        let key = PublicKey::new(PUB.as_bytes());
        let held = Decision {
            relays: Relays::new(["master-b".into(), "master-c".into()]),
            reached: Default::default(),
            ..decision(Verdict::Accepted(key.clone()), 9, &[(3, "b"), (4, "c")])
        };
        let seen =
            vec![decision(Verdict::Rejected(key), 4, &[]).seen(), decision(Verdict::Deleted, 3, &[(1, "b")]).seen()];
        let mine = Version::claim(false, &key_fingerprint());
        let bytes = encode_record(&held, &seen, Some(&mine));
        assert_eq!(decode_record("web01", &bytes), Some(Record { decision: held.clone(), seen, mine: Some(mine) }));
        let bytes = encode_record(&held, &[], None);
        assert_eq!(decode_record("web01", &bytes), Some(Record { decision: held, seen: vec![], mine: None }));
        assert_eq!(decode_record("web01", &bytes[..20]), None);
    }

    /// A store written by 0.1 is read: `supersedes` becomes the context.
    #[test]
    fn layout_1_records_are_read() {
        let mut old = vec![3];
        encode_version(&mut old, &Version::new(9, "a"));
        old.push(1);
        encode_version(&mut old, &Version::new(3, "b"));
        let read = decode_record("web01", &old).unwrap();
        assert_eq!(read.decision, decision(Verdict::Deleted, 9, &[(3, "b")]));
        assert!(read.seen.is_empty() && read.mine.is_none());
    }

    /// A context of more than 255 versions is kept whole (layout 3, and a
    /// conflict marked so); every other record stays in layout 2, which the
    /// builds before layout 3 read.
    #[test]
    fn contexts_longer_than_255_versions_are_kept_whole() {
        let key = PublicKey::new(PUB.as_bytes());
        let wide: Vec<(u64, String)> = (0..300).map(|n| ((1 << 50) + n, format!("node{n:03}"))).collect();
        let wide: Vec<(u64, &str)> = wide.iter().map(|(h, n)| (*h, n.as_str())).collect();
        let narrow = &wide[..255];
        for (context, layout) in [(narrow, LAYOUT_2), (&wide[..], LAYOUT_3)] {
            let held = decision(Verdict::Accepted(key.clone()), 1 << 51, context);
            let seen = vec![decision(Verdict::Deleted, (1 << 51) - 1, context).seen()];
            let bytes = encode_record(&held, &seen, None);
            assert_eq!(bytes[0], layout);
            let read = decode_record("web01", &bytes).expect("decoded");
            assert_eq!((read.decision.context.len(), read.seen[0].context.len()), (context.len(), context.len()));
            assert_eq!(read, Record { decision: held.clone(), seen: seen.clone(), mine: None });
            let conflict = Conflict { id: held.id.clone(), winner: held.seen(), loser: seen[0].clone() };
            let bytes = encode_conflict("master-b", &conflict);
            assert_eq!(bytes[0] == LAYOUT_3, layout == LAYOUT_3);
            assert_eq!(decode_conflict(&bytes), Some((keysync_machine::testkit::peer("master-b"), conflict)));
        }
    }

    #[test]
    fn conflicts_round_trip() {
        let key = PublicKey::new(PUB.as_bytes());
        let conflict = Conflict {
            id: MinionId::parse("web01").unwrap(),
            winner: decision(Verdict::Rejected(key), 9, &[]).seen(),
            loser: decision(Verdict::Deleted, 8, &[(2, "c")]).seen(),
        };
        let bytes = encode_conflict("master-b", &conflict);
        assert_eq!(decode_conflict(&bytes), Some((keysync_machine::testkit::peer("master-b"), conflict)));
        assert_eq!(decode_conflict(&bytes[..bytes.len() - 1]), None);
    }
}
