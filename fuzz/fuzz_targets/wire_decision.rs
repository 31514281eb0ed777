//! Peer messages: any bytes decoded as a `DecisionBatch` and validated. What
//! passes must be safe to write: a file name inside the folder, one public key.
#![no_main]

use keysync_proto::v1;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = v1::DecisionBatch::decode(data) else { return };
    for msg in batch.decisions {
        let Ok(decision) = salt_keysync::net::wire::decision_from_wire(msg) else { continue };
        let id = decision.id.as_str();
        assert!(!id.is_empty() && !id.starts_with('.') && !id.contains(['/', '\\', '\0']) && id.len() <= 255);
        if let Some(key) = decision.verdict.key() {
            assert!(!key.bytes().windows(11).any(|w| w == b"PRIVATE KEY"));
        }
    }
});
