//! Key-file content from a folder or a peer: whatever passes is one public key
//! block with no private key anywhere.
#![no_main]

use libfuzzer_sys::fuzz_target;
use keysync_machine::core::keyfile::check_public_key;

fuzz_target!(|data: &[u8]| {
    if check_public_key(data).is_ok() {
        assert!(!data.windows(11).any(|w| w == b"PRIVATE KEY"));
        let text = std::str::from_utf8(data).expect("accepted keys are text");
        assert_eq!(text.matches("-----BEGIN ").count(), 1);
    }
});
