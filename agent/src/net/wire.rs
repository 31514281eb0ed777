//! Conversions between the `keysync.v1` messages and the core's types. Every
//! field from the wire is validated here, before anything else sees it.

use keysync_proto::v1;

use crate::core::keyfile::{check_public_key, KeyError};
use crate::core::{Decision, MinionId, PublicKey, Verdict, Version};
use crate::disk::health::{MasterHealth, SETTINGS, UNSET};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("invalid minion id: {0}")]
    Id(#[from] crate::core::id::IdError),
    #[error("decision for {0:?} has no verdict")]
    NoVerdict(String),
    #[error("decision for {0:?} has no version")]
    NoVersion(String),
    #[error("decision for {id:?} carries an invalid node name {node:?}")]
    Node { id: String, node: String },
    #[error("decision for {id:?}: {source}")]
    Key { id: String, source: KeyError },
    #[error("delete decision for {0:?} carries a key")]
    KeyOnDelete(String),
}

impl WireError {
    /// The minion id the refused message was about, if it could be read.
    pub fn minion(&self) -> Option<&str> {
        match self {
            WireError::Id(_) => None,
            WireError::NoVerdict(id) | WireError::NoVersion(id) | WireError::KeyOnDelete(id) => Some(id),
            WireError::Node { id, .. } | WireError::Key { id, .. } => Some(id),
        }
    }
}

pub fn decision_from_wire(msg: v1::Decision) -> Result<Decision, WireError> {
    let id = MinionId::parse(&msg.minion)?;
    let raw_id = || msg.minion.clone();
    let version = msg.version.ok_or_else(|| WireError::NoVersion(raw_id()))?;
    let version = version_from_wire(version, &msg.minion)?;
    let supersedes = msg.supersedes.map(|v| version_from_wire(v, &msg.minion)).transpose()?;
    let key = |bytes: Vec<u8>| {
        check_public_key(&bytes).map_err(|source| WireError::Key { id: raw_id(), source })?;
        Ok::<_, WireError>(PublicKey::new(bytes))
    };
    let verdict = match v1::Verdict::try_from(msg.verdict) {
        Ok(v1::Verdict::Accepted) => Verdict::Accepted(key(msg.public_key)?),
        Ok(v1::Verdict::Rejected) => Verdict::Rejected(key(msg.public_key)?),
        Ok(v1::Verdict::Deleted) if msg.public_key.is_empty() => Verdict::Deleted,
        Ok(v1::Verdict::Deleted) => return Err(WireError::KeyOnDelete(raw_id())),
        Ok(v1::Verdict::Unspecified) | Err(_) => return Err(WireError::NoVerdict(raw_id())),
    };
    Ok(Decision { id, verdict, version, supersedes })
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
        supersedes: decision.supersedes.as_ref().map(version_to_wire),
    }
}

/// This master's health for Hello: fingerprints only.
pub fn health_to_wire(health: &MasterHealth) -> v1::MasterHealth {
    v1::MasterHealth {
        master_pub_sha256: health.master_pub.clone().unwrap_or_default(),
        settings: health.settings.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

/// A peer's health from Hello. Anything malformed is dropped (unknown, so
/// never reported as drift) rather than refusing the connection: key
/// decisions keep replicating whatever the peer says here.
pub fn health_from_wire(msg: Option<v1::MasterHealth>) -> MasterHealth {
    let Some(msg) = msg else { return MasterHealth::default() };
    let is_hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
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
        errors: Vec::new(),
    }
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
        }
    }

    #[test]
    fn round_trips() {
        let decision = decision_from_wire(accepted("web01")).unwrap();
        assert_eq!(decision_to_wire(&decision), accepted("web01"));
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
        ];
        for (msg, want) in cases {
            let err = decision_from_wire(msg.clone()).unwrap_err().to_string();
            assert!(err.contains(want), "{msg:?}: {err:?} should contain {want:?}");
        }
    }

    #[test]
    fn health_round_trips_and_drops_malformed_fields() {
        let fingerprint = crate::core::Fingerprint::of(PUB.as_bytes()).to_string();
        let health = MasterHealth {
            master_pub: Some(fingerprint),
            settings: [("peer".to_string(), UNSET.to_string()), ("nodegroups".to_string(), "ab".repeat(32))].into(),
            errors: Vec::new(),
        };
        assert_eq!(health_from_wire(Some(health_to_wire(&health))), health);
        let hostile = v1::MasterHealth {
            master_pub_sha256: "-----BEGIN PUBLIC KEY-----".into(),
            settings: [("../x".to_string(), UNSET.to_string()), ("peer".to_string(), "zz".into())].into(),
        };
        assert_eq!(health_from_wire(Some(hostile)), MasterHealth::default());
        assert_eq!(health_from_wire(None), MasterHealth::default());
    }
}
