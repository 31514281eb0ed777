//! Minion ids: accepted exactly when Salt's `valid_id` accepts them, within
//! NAME_MAX and not hidden; an accepted id never leaves its folder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use keysync_machine::core::MinionId;

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else { return };
    let salt_valid = !raw.is_empty() && !raw.contains(['/', '\\', '\0']) && raw != "." && raw != "..";
    let want = salt_valid && raw.len() <= 255 && !raw.starts_with('.');
    let got = MinionId::parse(raw);
    assert_eq!(got.is_ok(), want, "{raw:?}");
    if let Ok(id) = got {
        let folder = std::path::Path::new("/pki/minions");
        assert_eq!(folder.join(id.as_str()).parent(), Some(folder));
    }
});
