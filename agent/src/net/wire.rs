//! Conversions between the `keysync.v1` messages and the core's types. Every
//! field from the wire is validated here, before anything else sees it.

use keysync_proto::v1;

use crate::core::keyfile::{check_public_key, KeyError};
use crate::core::replica::Summary;
use crate::core::{Context, Decision, Fingerprint, MinionId, PublicKey, Relays, Verdict, Version};
use crate::disk::accept::{AcceptSettings, SigningSource};
use crate::disk::health::{KeyCounts, MasterHealth, SETTINGS, UNSET};
use crate::disk::salt_version::is_version;
use crate::ops::held::HeldCount;

pub mod buckets;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    // Causes are in the messages, not `source()`s: `{:#}` would print them twice.
    #[error("invalid minion id: {0}")]
    Id(crate::core::id::IdError),
    #[error("decision for {0:?} has no verdict")]
    NoVerdict(String),
    #[error("decision for {0:?} has no version")]
    NoVersion(String),
    #[error("decision for {id:?} carries an invalid node name {node:?}")]
    Node { id: String, node: String },
    #[error("decision for {id:?}: {cause}")]
    Key { id: String, cause: KeyError },
    #[error("delete decision for {0:?} carries a key")]
    KeyOnDelete(String),
    #[error("decision for {id:?} claims to know {known}, which is not older than the decision itself")]
    KnowsTheFuture { id: String, known: String },
    #[error("decision for {0:?} lists more than {MAX_CONTEXT} versions it knew")]
    ContextTooLarge(String),
    #[error("decision for {0:?} lists more than {max} relays or agents reached", max = crate::core::decision::MAX_RELAYS)]
    TooManyRelays(String),
}

impl From<crate::core::id::IdError> for WireError {
    fn from(error: crate::core::id::IdError) -> Self {
        WireError::Id(error)
    }
}

/// Most versions a decision's context may list: one per node of a site.
pub const MAX_CONTEXT: usize = 256;

impl WireError {
    /// The minion id the refused message was about, if it could be read.
    pub fn minion(&self) -> Option<&str> {
        match self {
            WireError::Id(_) => None,
            WireError::NoVerdict(id)
            | WireError::NoVersion(id)
            | WireError::KeyOnDelete(id)
            | WireError::ContextTooLarge(id)
            | WireError::TooManyRelays(id) => Some(id),
            WireError::Node { id, .. } | WireError::Key { id, .. } | WireError::KnowsTheFuture { id, .. } => Some(id),
        }
    }
}

pub fn decision_from_wire(msg: v1::Decision) -> Result<Decision, WireError> {
    let id = MinionId::parse(&msg.minion)?;
    let raw_id = || msg.minion.clone();
    let version = msg.version.ok_or_else(|| WireError::NoVersion(raw_id()))?;
    let version = version_from_wire(version, &msg.minion)?;
    if msg.context.len() > MAX_CONTEXT {
        return Err(WireError::ContextTooLarge(raw_id()));
    }
    // Protocol 1 sends only the version its origin held.
    let known = if msg.context.is_empty() { msg.supersedes.into_iter().collect() } else { msg.context };
    let mut context = Context::default();
    for known in known {
        let known = version_from_wire(known, &msg.minion)?;
        // A decision knows only what came before it (its clock witnessed
        // every version it saw): a claim of more would hide conflicts.
        if known >= version {
            return Err(WireError::KnowsTheFuture { id: raw_id(), known: known.to_string() });
        }
        context.add(&known);
    }
    let key = |bytes: Vec<u8>| {
        check_public_key(&bytes).map_err(|cause| WireError::Key { id: raw_id(), cause })?;
        Ok::<_, WireError>(PublicKey::new(bytes))
    };
    let verdict = match v1::Verdict::try_from(msg.verdict) {
        Ok(v1::Verdict::Accepted) => Verdict::Accepted(key(msg.public_key)?),
        Ok(v1::Verdict::Rejected) => Verdict::Rejected(key(msg.public_key)?),
        Ok(v1::Verdict::Deleted) if msg.public_key.is_empty() => Verdict::Deleted,
        Ok(v1::Verdict::Deleted) => return Err(WireError::KeyOnDelete(raw_id())),
        Ok(v1::Verdict::Unspecified) | Err(_) => return Err(WireError::NoVerdict(raw_id())),
    };
    let relays = names_from_wire(&msg.relays, &msg.minion)?;
    let reached = names_from_wire(&msg.reached, &msg.minion)?;
    Ok(Decision { id, verdict, version, context, relays, reached })
}

/// A decision's `relays` or `reached`: at most [`MAX_RELAYS`] node names.
///
/// [`MAX_RELAYS`]: crate::core::decision::MAX_RELAYS
fn names_from_wire(names: &[String], id: &str) -> Result<Relays, WireError> {
    if names.len() > crate::core::decision::MAX_RELAYS {
        return Err(WireError::TooManyRelays(id.into()));
    }
    let mut checked = Vec::with_capacity(names.len());
    for name in names {
        checked.push(version_from_wire(v1::Version { hlc: 0, node: name.clone() }, id)?.node);
    }
    Ok(Relays::new(checked))
}

pub fn version_from_wire(msg: v1::Version, id: &str) -> Result<Version, WireError> {
    let valid = !msg.node.is_empty()
        && msg.node.len() <= 253
        && msg.node.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !valid {
        return Err(WireError::Node { id: id.into(), node: msg.node.escape_debug().to_string() });
    }
    Ok(Version { hlc: msg.hlc, node: crate::core::version::node_name(&msg.node) })
}

pub fn version_to_wire(version: &Version) -> v1::Version {
    v1::Version { hlc: version.hlc, node: version.node.to_string() }
}

pub fn decision_to_wire(decision: &Decision) -> v1::Decision {
    let verdict = match decision.verdict {
        Verdict::Accepted(_) => v1::Verdict::Accepted,
        Verdict::Rejected(_) => v1::Verdict::Rejected,
        Verdict::Deleted => v1::Verdict::Deleted,
    };
    v1::Decision {
        minion: decision.id.to_string(),
        verdict: verdict.into(),
        public_key: decision.verdict.key().map(|k| k.bytes().to_vec()).unwrap_or_default(),
        version: Some(version_to_wire(&decision.version)),
        supersedes: decision.context.highest().map(version_to_wire),
        context: decision.context.iter().map(version_to_wire).collect(),
        relays: decision.relays.iter().map(str::to_string).collect(),
        reached: decision.reached.iter().map(str::to_string).collect(),
    }
}

/// An id's anti-entropy summary for the wire.
pub fn summary_to_wire(id: &MinionId, summary: &Summary) -> v1::Summary {
    let (verdict, fingerprint) = match summary.content {
        Some((rank, fingerprint)) => (verdict_of_rank(rank), fingerprint.map(|f| f.0.to_vec()).unwrap_or_default()),
        None => (v1::Verdict::Unspecified, Vec::new()),
    };
    v1::Summary {
        minion: id.to_string(),
        version: Some(version_to_wire(&summary.version)),
        verdict: verdict.into(),
        fingerprint,
    }
}

/// A peer's summary; `None` when the id or version is malformed (that id is
/// then not fetched). Content a protocol-1 peer leaves out is unknown.
pub fn summary_from_wire(msg: v1::Summary) -> Option<(MinionId, Summary)> {
    let id = MinionId::parse(&msg.minion).ok()?;
    let version = version_from_wire(msg.version?, id.as_str()).ok()?;
    let fingerprint = match msg.fingerprint.len() {
        0 => None,
        32 => Some(Fingerprint(msg.fingerprint.try_into().ok()?)),
        _ => return None,
    };
    let content = match v1::Verdict::try_from(msg.verdict) {
        Ok(v1::Verdict::Accepted) if fingerprint.is_some() => Some((0, fingerprint)),
        Ok(v1::Verdict::Deleted) if fingerprint.is_none() => Some((1, None)),
        Ok(v1::Verdict::Rejected) if fingerprint.is_some() => Some((2, fingerprint)),
        _ => None,
    };
    Some((id, Summary { version, content }))
}

/// The verdict a content rank stands for (see `Seen::content_rank`).
fn verdict_of_rank(rank: u8) -> v1::Verdict {
    match rank {
        0 => v1::Verdict::Accepted,
        1 => v1::Verdict::Deleted,
        _ => v1::Verdict::Rejected,
    }
}

/// This master's health for Hello: fingerprints where values could be
/// sensitive, never a key.
pub fn health_to_wire(health: &MasterHealth) -> v1::MasterHealth {
    v1::MasterHealth {
        master_pub_sha256: health.master_pub.clone().unwrap_or_default(),
        settings: health.settings.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        salt_version: health.salt_version.clone().unwrap_or_default(),
        accept: health.accept.as_ref().map(accept_to_wire),
        keys: health.keys.as_ref().map(|k| v1::KeyCounts {
            accepted: k.accepted as u64,
            rejected: k.rejected as u64,
            pending: k.pending as u64,
            deleted: k.deleted as u64,
        }),
        agent_version: health.agent_version.clone().unwrap_or_default(),
    }
}

fn accept_to_wire(accept: &AcceptSettings) -> v1::AcceptSettings {
    v1::AcceptSettings {
        auto_accept: accept.auto_accept,
        open_mode: accept.open_mode,
        autosign_file: Some(source_to_wire(&accept.autosign_file)),
        autosign_grains_dir: Some(source_to_wire(&accept.autosign_grains_dir)),
        autoreject_file: Some(source_to_wire(&accept.autoreject_file)),
        key_cache: accept.key_cache.clone(),
        keys_cache_driver: accept.keys_cache_driver.clone(),
    }
}

fn source_to_wire(source: &SigningSource) -> v1::SigningSource {
    use v1::signing_source::State;
    match source {
        SigningSource::Unset => v1::SigningSource { state: State::Unset.into(), ..Default::default() },
        SigningSource::Absent => v1::SigningSource { state: State::Absent.into(), ..Default::default() },
        SigningSource::Present { entries, sha256 } => v1::SigningSource {
            state: State::Present.into(),
            entries: *entries,
            sha256: sha256.clone().unwrap_or_default(),
        },
    }
}

fn is_hex(text: &str, n: usize) -> bool {
    text.len() == n && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A peer's health from Hello. Anything malformed is dropped (unknown, so
/// never reported as drift) rather than refusing the connection: key
/// decisions keep replicating whatever the peer says here.
pub fn health_from_wire(msg: Option<v1::MasterHealth>) -> MasterHealth {
    let Some(msg) = msg else { return MasterHealth::default() };
    let colon_hex = msg.master_pub_sha256.len() == 95
        && msg.master_pub_sha256.split(':').all(|pair| is_hex(pair, 2))
        && msg.master_pub_sha256.split(':').count() == 32;
    MasterHealth {
        master_pub: colon_hex.then_some(msg.master_pub_sha256),
        settings: msg
            .settings
            .into_iter()
            .filter(|(name, value)| SETTINGS.contains(&name.as_str()) && (value == UNSET || is_hex(value, 64)))
            .collect(),
        salt_version: is_version(&msg.salt_version).then_some(msg.salt_version),
        accept: msg.accept.and_then(accept_from_wire),
        keys: msg.keys.map(|k| KeyCounts {
            accepted: count(k.accepted),
            rejected: count(k.rejected),
            pending: count(k.pending),
            deleted: count(k.deleted),
        }),
        agent_version: is_version(&msg.agent_version).then_some(msg.agent_version),
        errors: Vec::new(),
    }
}

/// Origins a peer's `Hello` may say its guard holds deletes from: more
/// than any site has masters; the rest of a longer list is not kept.
pub const MAX_HELD_ORIGINS: usize = 64;

/// What this master's guard holds, per origin, for a `Hello`.
pub fn held_to_wire(held: &[HeldCount]) -> Vec<v1::HeldCount> {
    held.iter().map(|h| v1::HeldCount { origin: h.origin.clone(), count: h.count as u64 }).collect()
}

/// What a peer says its guard holds, per origin: its own claim, kept as
/// far as it makes sense (a node name, a count above 0, each origin once,
/// at most [`MAX_HELD_ORIGINS`] of them), by origin.
pub fn held_from_wire(held: Vec<v1::HeldCount>) -> Vec<HeldCount> {
    let mut kept: std::collections::BTreeMap<String, usize> = Default::default();
    for h in held {
        if kept.len() >= MAX_HELD_ORIGINS {
            break;
        }
        if h.count > 0 && crate::config::check_node_name(&h.origin).is_ok() && !kept.contains_key(&h.origin) {
            kept.insert(h.origin, count(h.count));
        }
    }
    kept.into_iter().map(|(origin, count)| HeldCount { origin, count }).collect()
}

fn count(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Names Salt uses for a key cache or driver: short, plain.
fn is_name(text: &str) -> bool {
    text.len() <= 64 && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The whole message or nothing: half of it could hide an auto-accepting
/// master behind a missing field.
fn accept_from_wire(msg: v1::AcceptSettings) -> Option<AcceptSettings> {
    if !is_name(&msg.key_cache) || !is_name(&msg.keys_cache_driver) || msg.keys_cache_driver.is_empty() {
        return None;
    }
    Some(AcceptSettings {
        auto_accept: msg.auto_accept,
        open_mode: msg.open_mode,
        autosign_file: source_from_wire(msg.autosign_file?)?,
        autosign_grains_dir: source_from_wire(msg.autosign_grains_dir?)?,
        autoreject_file: source_from_wire(msg.autoreject_file?)?,
        key_cache: msg.key_cache,
        keys_cache_driver: msg.keys_cache_driver,
    })
}

fn source_from_wire(msg: v1::SigningSource) -> Option<SigningSource> {
    use v1::signing_source::State;
    let sha256 = match msg.sha256.as_str() {
        "" => None,
        hash if is_hex(hash, 64) => Some(msg.sha256),
        _ => return None,
    };
    match State::try_from(msg.state).ok()? {
        State::Unset => Some(SigningSource::Unset),
        State::Absent => Some(SigningSource::Absent),
        State::Present => Some(SigningSource::Present { entries: msg.entries, sha256 }),
        State::Unspecified => None,
    }
}

/// This agent's clocks, for a `Hello`.
pub fn clock_to_wire(clock: &crate::ops::clocks::ClockReading) -> v1::ClockReading {
    v1::ClockReading { wall_ms: clock.wall_ms, stamp_ms: clock.stamp_ms, max_skew_ms: clock.max_skew_ms }
}

/// A peer's clocks as its `Hello` says them; `None` from an agent that
/// does not send them, or with no wall clock (0).
pub fn clock_from_wire(msg: Option<v1::ClockReading>) -> Option<crate::ops::clocks::ClockReading> {
    let msg = msg.filter(|m| m.wall_ms > 0)?;
    Some(crate::ops::clocks::ClockReading {
        wall_ms: msg.wall_ms,
        stamp_ms: msg.stamp_ms.max(msg.wall_ms),
        max_skew_ms: msg.max_skew_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keysync_machine::testkit::PUB;

    fn accepted(minion: &str) -> v1::Decision {
        v1::Decision {
            minion: minion.into(),
            verdict: v1::Verdict::Accepted.into(),
            public_key: PUB.as_bytes().to_vec(),
            version: Some(v1::Version { hlc: 5, node: "master-a".into() }),
            supersedes: None,
            context: Vec::new(),
            relays: Vec::new(),
            reached: Default::default(),
        }
    }

    fn version(hlc: u64, node: &str) -> v1::Version {
        v1::Version { hlc, node: node.into() }
    }

    #[test]
    fn round_trips() {
        let decision = decision_from_wire(accepted("web01")).unwrap();
        assert_eq!(decision_to_wire(&decision), accepted("web01"));
        let known = v1::Decision { context: vec![version(3, "master-b"), version(4, "master-c")], ..accepted("web01") };
        let decision = decision_from_wire(known.clone()).unwrap();
        assert_eq!(decision.context.len(), 2);
        // Protocol-1 peers read the highest known version as `supersedes`.
        assert_eq!(decision_to_wire(&decision), v1::Decision { supersedes: Some(version(4, "master-c")), ..known });
        // The agents it passed through and those it was pushed to.
        let routed = v1::Decision {
            relays: vec!["master-b".into()],
            reached: vec!["master-c".into(), "master-d".into()],
            ..accepted("web01")
        };
        let decision = decision_from_wire(routed.clone()).unwrap();
        assert_eq!(decision.reached.iter().collect::<Vec<_>>(), ["master-c", "master-d"]);
        assert_eq!(decision_to_wire(&decision), routed);
    }

    /// A protocol-1 peer's `supersedes` is its decision's whole context.
    #[test]
    fn a_protocol_1_decision_knows_what_it_superseded() {
        let old = v1::Decision { supersedes: Some(version(3, "master-b")), ..accepted("web01") };
        let decision = decision_from_wire(old).unwrap();
        assert_eq!(
            decision.context.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [Version::new(3, "master-b").to_string()]
        );
    }

    #[test]
    fn summaries_carry_what_the_decision_says() {
        let id = MinionId::parse("web01").unwrap();
        let decision = decision_from_wire(accepted("web01")).unwrap();
        let summary = Summary::of(&decision.seen());
        assert_eq!(summary_from_wire(summary_to_wire(&id, &summary)), Some((id.clone(), summary.clone())));
        let from_protocol_1 =
            v1::Summary { minion: "web01".into(), version: Some(version(5, "master-a")), ..Default::default() };
        assert_eq!(summary_from_wire(from_protocol_1), Some((id, Summary { content: None, ..summary })));
        let bad =
            v1::Summary { minion: "web01".into(), version: Some(version(5, "a")), verdict: 1, fingerprint: vec![1; 7] };
        assert_eq!(summary_from_wire(bad), None);
    }

    #[test]
    fn refuses_hostile_fields() {
        let private = "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n";
        let cases: Vec<(v1::Decision, &str)> = vec![
            (accepted("../master.pem"), "invalid minion id"),
            (accepted("a/b"), "invalid minion id"),
            (accepted("."), "invalid minion id"),
            (accepted(".."), "invalid minion id"),
            (accepted("a\\b"), "invalid minion id"),
            (accepted(""), "invalid minion id"),
            (accepted("a\0b"), "invalid minion id"),
            (accepted(&"x".repeat(300)), "invalid minion id"),
            (v1::Decision { public_key: private.into(), ..accepted("web01") }, "private key"),
            (v1::Decision { public_key: vec![], ..accepted("web01") }, "key file is empty"),
            (v1::Decision { verdict: 0, ..accepted("web01") }, "no verdict"),
            (v1::Decision { verdict: 77, ..accepted("web01") }, "no verdict"),
            (v1::Decision { version: None, ..accepted("web01") }, "no version"),
            (v1::Decision { verdict: v1::Verdict::Deleted.into(), ..accepted("web01") }, "carries a key"),
            (
                v1::Decision { version: Some(v1::Version { hlc: 1, node: "../x".into() }), ..accepted("web01") },
                "invalid node name",
            ),
            (v1::Decision { context: vec![version(5, "master-b")], ..accepted("web01") }, "not older than"),
            (v1::Decision { supersedes: Some(version(9, "master-b")), ..accepted("web01") }, "not older than"),
            (v1::Decision { context: vec![version(1, "x"); MAX_CONTEXT + 1], ..accepted("web01") }, "more than"),
            (v1::Decision { relays: vec!["x".into(); 17], ..accepted("web01") }, "more than 16 relays"),
            (v1::Decision { reached: vec!["x".into(); 17], ..accepted("web01") }, "or agents reached"),
            (v1::Decision { reached: vec!["../x".into()], ..accepted("web01") }, "invalid node name"),
        ];
        for (msg, want) in cases {
            let err = decision_from_wire(msg.clone()).unwrap_err().to_string();
            assert!(err.contains(want), "{msg:?}: {err:?} should contain {want:?}");
        }
    }

    /// A peer's clocks as its Hello says them; none from an agent that
    /// does not send them, or with no wall clock; a stamp never behind the
    /// wall clock it came with.
    #[test]
    fn clocks_round_trip_and_an_empty_reading_is_none() {
        use crate::ops::clocks::ClockReading;
        let clock = ClockReading { wall_ms: 1_800_000_000_000, stamp_ms: 1_800_000_060_000, max_skew_ms: 300_000 };
        assert_eq!(clock_from_wire(Some(clock_to_wire(&clock))), Some(clock));
        assert_eq!(clock_from_wire(None), None);
        assert_eq!(clock_from_wire(Some(v1::ClockReading::default())), None);
        let behind = v1::ClockReading { wall_ms: 5_000, stamp_ms: 1, max_skew_ms: 0 };
        assert_eq!(clock_from_wire(Some(behind)).map(|c| c.stamp_ms), Some(5_000));
    }

    #[test]
    fn health_round_trips_and_drops_malformed_fields() {
        let fingerprint = crate::core::Fingerprint::of(PUB.as_bytes()).to_string();
        let health = MasterHealth {
            master_pub: Some(fingerprint),
            settings: [("peer".to_string(), UNSET.to_string()), ("nodegroups".to_string(), "ab".repeat(32))].into(),
            salt_version: Some("3008.3".into()),
            accept: Some(AcceptSettings {
                auto_accept: true,
                autosign_file: SigningSource::Present { entries: Some(2), sha256: Some("cd".repeat(32)) },
                autosign_grains_dir: SigningSource::Present { entries: None, sha256: None },
                autoreject_file: SigningSource::Absent,
                key_cache: "sched".into(),
                ..AcceptSettings::salt_defaults()
            }),
            keys: Some(KeyCounts { accepted: 3, rejected: 1, pending: 0, deleted: 7 }),
            agent_version: Some("0.2.0".into()),
            errors: Vec::new(),
        };
        assert_eq!(health_from_wire(Some(health_to_wire(&health))), health);
        let hostile = v1::MasterHealth {
            master_pub_sha256: "-----BEGIN PUBLIC KEY-----".into(),
            settings: [("../x".to_string(), UNSET.to_string()), ("peer".to_string(), "zz".into())].into(),
            salt_version: "3008.3\n\x1b[31m".into(),
            accept: Some(v1::AcceptSettings {
                keys_cache_driver: "../mmap".into(),
                ..accept_to_wire(health.accept.as_ref().unwrap())
            }),
            keys: None,
            agent_version: "0.2.0 \u{202e}".into(),
        };
        assert_eq!(health_from_wire(Some(hostile)), MasterHealth::default());
        assert_eq!(health_from_wire(None), MasterHealth::default());
        // A signing source with an unknown state or a bad hash drops the whole
        // accept report: unknown, never "not auto-accepting".
        let mut partial = health_to_wire(&health);
        partial.accept.as_mut().unwrap().autosign_file.as_mut().unwrap().state = 9;
        assert_eq!(health_from_wire(Some(partial)).accept, None);
        let mut partial = health_to_wire(&health);
        partial.accept.as_mut().unwrap().autoreject_file = None;
        assert_eq!(health_from_wire(Some(partial)).accept, None);
    }

    /// MasterHealth as agents before the salt version, accept settings, key
    /// counts and agent version (fields 3-6) encode and decode it.
    #[derive(Clone, PartialEq, prost::Message)]
    struct OldMasterHealth {
        #[prost(string, tag = "1")]
        master_pub_sha256: String,
        #[prost(map = "string, string", tag = "2")]
        settings: std::collections::HashMap<String, String>,
    }

    #[test]
    fn health_stays_wire_compatible_with_older_agents() {
        use prost::Message;
        let old = OldMasterHealth { master_pub_sha256: "aa".into(), settings: [("peer".into(), UNSET.into())].into() };
        let new = v1::MasterHealth::decode(old.encode_to_vec().as_slice()).unwrap();
        let health = health_from_wire(Some(new));
        assert_eq!((health.salt_version, health.accept, health.keys), (None, None, None), "unknown, not empty");
        assert_eq!(health.agent_version, None, "an agent of 0.1.0 sends no version");
        let ours = v1::MasterHealth {
            salt_version: "3008.3".into(),
            agent_version: "0.2.0".into(),
            accept: Some(accept_to_wire(&AcceptSettings::salt_defaults())),
            keys: Some(v1::KeyCounts { accepted: 1, ..Default::default() }),
            ..old.clone().into_new()
        };
        let seen_by_old = OldMasterHealth::decode(ours.encode_to_vec().as_slice()).unwrap();
        assert_eq!(seen_by_old, old, "an older agent reads what it knows and skips the rest");
    }

    /// Issue 28 item 2: a peer's held counts are its own claim, kept only as
    /// far as they make sense, and bounded.
    #[test]
    fn held_counts_round_trip_and_a_hostile_list_is_bounded() {
        let held =
            vec![HeldCount { origin: "master-a".into(), count: 20 }, HeldCount { origin: "master-c".into(), count: 3 }];
        assert_eq!(held_from_wire(held_to_wire(&held)), held);
        let wire = |origin: &str, count: u64| v1::HeldCount { origin: origin.into(), count };
        let hostile = vec![
            wire("master-c", 3),
            wire("master-a", 20),
            wire("master-a", 99),
            wire("MASTER-A", 5),
            wire("master-a\n\u{1b}[8m", 5),
            wire("", 5),
            wire("master-d", 0),
            wire("master-e", u64::MAX),
        ];
        let kept = held_from_wire(hostile);
        assert_eq!(
            kept,
            [
                HeldCount { origin: "master-a".into(), count: 20 },
                HeldCount { origin: "master-c".into(), count: 3 },
                HeldCount { origin: "master-e".into(), count: usize::try_from(u64::MAX).unwrap_or(usize::MAX) },
            ],
            "the first count of each origin named as a node is; none of the rest"
        );
        let flood: Vec<v1::HeldCount> = (0..10_000).map(|i| wire(&format!("m{i}"), 1)).collect();
        assert_eq!(held_from_wire(flood).len(), MAX_HELD_ORIGINS);
    }

    /// HelloRequest as agents of 0.1.0 encode and decode it (fields 1-3).
    #[derive(Clone, PartialEq, prost::Message)]
    struct OldHello {
        #[prost(string, tag = "1")]
        node: String,
        #[prost(uint32, tag = "2")]
        protocol_version: u32,
    }

    #[test]
    fn held_counts_stay_wire_compatible_with_older_agents() {
        use prost::Message;
        let old = OldHello { node: "master-b".into(), protocol_version: 1 };
        let new = v1::HelloRequest::decode(old.encode_to_vec().as_slice()).unwrap();
        assert!(new.held.is_empty(), "an older agent tells nothing held");
        let ours = v1::HelloRequest {
            node: "master-b".into(),
            protocol_version: 1,
            held: held_to_wire(&[HeldCount { origin: "master-a".into(), count: 2 }]),
            ..Default::default()
        };
        assert_eq!(OldHello::decode(ours.encode_to_vec().as_slice()).unwrap(), old, "and skips what we tell");
        let answer = v1::HelloResponse { held: ours.held.clone(), ..Default::default() };
        let seen = v1::HelloResponse::decode(answer.encode_to_vec().as_slice()).unwrap();
        assert_eq!(held_from_wire(seen.held), [HeldCount { origin: "master-a".into(), count: 2 }]);
    }

    impl OldMasterHealth {
        fn into_new(self) -> v1::MasterHealth {
            v1::MasterHealth {
                master_pub_sha256: self.master_pub_sha256,
                settings: self.settings,
                ..Default::default()
            }
        }
    }
}
