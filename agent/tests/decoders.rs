//! Bounded fuzzing of everything that parses untrusted bytes (issue 4 item 3),
//! run by the normal `cargo test` in a few seconds: protobuf decoding of peer
//! messages, the wire validators, minion ids and key-file content. The same
//! entry points have cargo-fuzz targets under `fuzz/` for long runs.
//!
//! The properties are the security invariants, not "does not panic" alone:
//! whatever is accepted is safe to use as a file name inside a key folder and
//! is exactly one public key with no private-key block.

use std::path::{Component, Path};

use keysync_proto::v1;
use proptest::prelude::*;
use prost::Message;
use salt_keysync::core::keyfile::{check_public_key, KeyError, MAX_KEY_BYTES};
use salt_keysync::core::{MinionId, Verdict};
use salt_keysync::net::wire::{decision_from_wire, decision_to_wire};

use keysync_machine::testkit::{PRIVATE, PUB};

/// An accepted id must name a file directly inside the folder: one normal
/// path component, not hidden, within NAME_MAX.
fn assert_safe_id(id: &MinionId) {
    let raw = id.as_str();
    let folder = Path::new("/pki/minions");
    let joined = folder.join(raw);
    assert_eq!(joined.parent(), Some(folder), "{raw:?} escapes the folder");
    assert!(matches!(Path::new(raw).components().collect::<Vec<_>>()[..], [Component::Normal(_)]), "{raw:?}");
    assert!(!raw.starts_with('.') && !raw.contains(['\0', '\\', '/']) && raw.len() <= 255, "{raw:?}");
}

fn assert_safe_key(bytes: &[u8]) {
    assert!(bytes.len() <= MAX_KEY_BYTES);
    assert!(!bytes.windows(11).any(|w| w == b"PRIVATE KEY"), "private key accepted");
    let text = std::str::from_utf8(bytes).expect("accepted keys are text");
    assert_eq!(text.matches("-----BEGIN ").count(), 1, "{text:?}");
}

/// Ids built from the pieces attacks are made of.
fn hostile_id() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("..".to_string()),
        Just(".".to_string()),
        Just("/".to_string()),
        Just("\\".to_string()),
        Just("\0".to_string()),
        Just("master.pem".to_string()),
        Just("minions".to_string()),
        Just("é".to_string()),
        "[a-z0-9_.-]{1,8}",
        "\\PC{1,4}",
    ];
    prop_oneof![
        prop::collection::vec(piece, 0..6).prop_map(|pieces| pieces.concat()),
        (250usize..260).prop_map(|n| "x".repeat(n)),
    ]
}

/// Key bytes: the real key, mutated, truncated, doubled, or with a private key spliced in.
fn hostile_key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(PUB.as_bytes().to_vec()),
        (0..PUB.len()).prop_map(|n| PUB.as_bytes()[..n].to_vec()),
        (0..PUB.len(), any::<u8>()).prop_map(|(at, b)| {
            let mut bytes = PUB.as_bytes().to_vec();
            bytes[at] = b;
            bytes
        }),
        (0..=PUB.len()).prop_map(|at| [&PUB.as_bytes()[..at], PRIVATE.as_bytes(), &PUB.as_bytes()[at..]].concat()),
        Just(format!("{PUB}{PUB}").into_bytes()),
        prop::collection::vec(any::<u8>(), 0..200),
    ]
}

fn wire_decision() -> impl Strategy<Value = v1::Decision> {
    (hostile_id(), 0i32..5, hostile_key(), any::<u64>(), "[a-z.-]{0,6}|\\PC{0,4}", any::<bool>()).prop_map(
        |(minion, verdict, public_key, hlc, node, with_version)| {
            // What it knew: a version of the same node, maybe not older than itself;
            // `supersedes` is its highest, as this agent writes it for protocol-1 peers.
            let known = with_version.then(|| v1::Version { hlc: hlc.wrapping_sub(1), node: node.clone() });
            v1::Decision {
                minion,
                verdict,
                public_key,
                version: with_version.then_some(v1::Version { hlc, node }),
                supersedes: known.clone(),
                context: known.into_iter().collect(),
                relays: Vec::new(),
                reached: Default::default(),
            }
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any bytes from the network: decoding never panics, and every decision
    /// the validator lets through has a safe id and (if any) a safe key.
    #[test]
    fn arbitrary_bytes_never_yield_an_unsafe_decision(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(batch) = v1::DecisionBatch::decode(bytes.as_slice()) {
            for msg in batch.decisions {
                if let Ok(decision) = decision_from_wire(msg) {
                    assert_safe_id(&decision.id);
                    if let Some(key) = decision.verdict.key() {
                        assert_safe_key(key.bytes());
                    }
                }
            }
        }
        let _ = v1::FetchRequest::decode(bytes.as_slice());
        let _ = v1::DiffRequest::decode(bytes.as_slice());
    }

    /// Structured hostile decisions: accepted ones are safe and survive a
    /// round trip through the wire unchanged; a delete never carries a key.
    #[test]
    fn validated_decisions_are_safe_and_round_trip(msg in wire_decision()) {
        match decision_from_wire(msg.clone()) {
            Ok(decision) => {
                assert_safe_id(&decision.id);
                match &decision.verdict {
                    Verdict::Accepted(key) | Verdict::Rejected(key) => assert_safe_key(key.bytes()),
                    Verdict::Deleted => prop_assert!(msg.public_key.is_empty()),
                }
                prop_assert_eq!(decision_to_wire(&decision), msg);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// Encoded and decoded again, a valid message means the same thing.
    #[test]
    fn encoding_is_faithful(msg in wire_decision()) {
        let batch = v1::DecisionBatch { decisions: vec![msg] };
        let decoded = v1::DecisionBatch::decode(batch.encode_to_vec().as_slice()).unwrap();
        prop_assert_eq!(decoded, batch);
    }

    /// `MinionId::parse` is exactly Salt's `valid_id` plus NAME_MAX and no leading dot.
    #[test]
    fn ids_follow_salts_rules(raw in hostile_id()) {
        let salt_valid = !raw.is_empty() && !raw.contains(['/', '\\', '\0']) && raw != "." && raw != "..";
        let want = salt_valid && raw.len() <= 255 && !raw.starts_with('.');
        match MinionId::parse(&raw) {
            Ok(id) => {
                prop_assert!(want, "{:?} accepted", raw);
                assert_safe_id(&id);
            }
            Err(_) => prop_assert!(!want, "{:?} refused", raw),
        }
    }

    /// Key content: whatever passes is one public key without a private block,
    /// and a private block anywhere is never accepted.
    #[test]
    fn key_checks_never_pass_a_private_key(bytes in hostile_key()) {
        if check_public_key(&bytes).is_ok() {
            assert_safe_key(&bytes);
        }
        if bytes.windows(11).any(|w| w == b"PRIVATE KEY") {
            prop_assert!(check_public_key(&bytes).is_err());
        }
    }
}

#[test]
fn oversized_keys_are_refused_before_parsing() {
    let mut big = PUB.as_bytes().to_vec();
    big.resize(MAX_KEY_BYTES + 1, b'\n');
    assert_eq!(check_public_key(&big), Err(KeyError::TooLarge(MAX_KEY_BYTES as u64 + 1)));
}
