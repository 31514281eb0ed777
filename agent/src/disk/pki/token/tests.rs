//! Tokens against real files: a file untouched is unchanged, any change
//! to its bytes, mode, links or name is seen, and no token is taken of a
//! file changed within `SETTLED` of its read.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use super::super::identity::Identity;
use super::super::tests::setup;
use super::*;
use keysync_machine::testkit::PUB;

#[test]
fn a_token_is_taken_of_a_settled_key_file_and_any_change_to_it_is_seen() {
    let (dir, pki) = setup();
    let accepted = dir.path().join("minions");
    let names = ["same", "rewritten", "chmodded", "linked", "symlinked", "replaced", "removed", "moved"];
    for name in names {
        fs::write(accepted.join(name), PUB).unwrap();
    }
    // Just written: read, but no token (a change in the same clock tick
    // would keep the times).
    let (slot, token) = pki.read_slot_token(Folder::Accepted, "same");
    assert!(matches!(slot, Slot::Key(_)), "{slot:?}");
    assert_eq!(token, None, "a file changed within SETTLED has no token");
    std::thread::sleep(SETTLED + Duration::from_millis(100));
    let tokens: Vec<FileToken> = names
        .iter()
        .map(|name| {
            let (slot, token) = pki.read_slot_token(Folder::Accepted, name);
            assert!(matches!(slot, Slot::Key(_)), "{name}: {slot:?}");
            token.unwrap_or_else(|| panic!("{name}: settled, a token is taken"))
        })
        .collect();
    assert!(tokens.iter().all(|token| token.folder() == Folder::Accepted));
    // Each change, made after the tokens were taken.
    fs::write(accepted.join("rewritten"), PUB).unwrap();
    fs::set_permissions(accepted.join("chmodded"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::hard_link(accepted.join("linked"), dir.path().join("elsewhere")).unwrap();
    fs::remove_file(accepted.join("symlinked")).unwrap();
    std::os::unix::fs::symlink(accepted.join("same"), accepted.join("symlinked")).unwrap();
    fs::write(accepted.join("new"), PUB).unwrap();
    fs::rename(accepted.join("new"), accepted.join("replaced")).unwrap();
    fs::remove_file(accepted.join("removed")).unwrap();
    fs::rename(accepted.join("moved"), dir.path().join("minions_rejected/moved")).unwrap();
    let unchanged: Vec<(&str, bool)> =
        names.iter().zip(&tokens).map(|(name, token)| (*name, pki.unchanged(*token, name))).collect();
    assert_eq!(
        unchanged,
        vec![
            ("same", true),
            ("rewritten", false),
            ("chmodded", false),
            ("linked", false),
            ("symlinked", false),
            ("replaced", false),
            ("removed", false),
            ("moved", false),
        ]
    );
    // A token names its folder: the same name elsewhere is not its file.
    let moved = FileToken::new(Folder::Rejected, 0);
    assert_eq!(moved.folder(), Folder::Rejected);
    assert!(!pki.unchanged(moved, "moved"));
    // What is not a key has no token.
    fs::write(accepted.join("junk"), "not a key").unwrap();
    std::thread::sleep(SETTLED + Duration::from_millis(100));
    assert_eq!(pki.read_slot_token(Folder::Accepted, "junk").1, None);
    assert!(pki.read_slot_token(Folder::Accepted, "same").1.is_some_and(|token| pki.unchanged(token, "same")));
}

/// The rule is the change time's: a file whose modification time was set
/// back (`touch -d`) was still changed just now, and has no token.
#[test]
fn a_file_changed_just_now_has_no_token_whatever_its_modification_time() {
    let (dir, pki) = setup();
    let path = dir.path().join("minions/old");
    fs::write(&path, PUB).unwrap();
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    fs::File::options().write(true).open(&path).unwrap().set_modified(hour_ago).unwrap();
    let st = rustix::fs::stat(&path).unwrap();
    assert!(st.st_mtime < st.st_ctime - 3000, "the modification time is an hour back");
    assert_eq!(pki.read_slot_token(Folder::Accepted, "old").1, None);
    let settled = SystemTime::now() + SETTLED + Duration::from_secs(1);
    let identity = Identity::of(&st).unwrap();
    assert!(pki.tokens.token_of(Folder::Accepted, identity, pki.tokens.epoch_at(settled), Some(settled)).is_some());
}

/// A step of the wall clock back by a second or more starts an epoch, and
/// a token of the epoch before is not one of the new: a change after the
/// step could get a change time a token holds.
#[test]
fn a_step_of_the_clock_back_voids_every_token() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("k"), PUB).unwrap();
    let identity = Identity::of(&rustix::fs::stat(dir.path().join("k")).unwrap()).unwrap();
    let later = SystemTime::now() + Duration::from_secs(10);
    let tokens = Tokens::default();
    let token_at = |at: SystemTime| tokens.token_of(Folder::Accepted, identity, tokens.epoch_at(at), Some(at));
    assert_eq!(tokens.epoch_at(later), 0);
    let before = token_at(later);
    assert_eq!(tokens.epoch_at(later - Duration::from_millis(500)), 0, "half a second: jitter, not a step");
    assert_eq!(tokens.epoch_at(later + Duration::from_secs(5)), 0);
    assert_eq!(before, token_at(later + Duration::from_secs(5)));
    assert_eq!(tokens.epoch_at(later), 1, "five seconds back: a step");
    assert_eq!(tokens.epoch_at(later + Duration::from_secs(1)), 1, "the new epoch goes on");
    let after = token_at(later + Duration::from_secs(1));
    assert!(before.is_some() && after.is_some() && before != after);
}

/// Tokens are given on local file systems only: a network file system can
/// answer `fstatat` from a cache, with its server's clock.
#[test]
fn only_local_file_systems_give_tokens() {
    use rustix::fs::{Mode, OFlags};
    let open =
        |path: &std::path::Path| rustix::fs::open(path, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
    assert!(!is_local(&open("/proc".as_ref())), "procfs is not one of them");
    let (dir, pki) = setup();
    assert!(is_local(&open(dir.path())), "the temporary folder's file system is");
    assert!(pki.folder_local(Folder::Accepted).unwrap().1);
    // A key folder not on one (as a reopen would find it): read, no token.
    fs::write(dir.path().join("minions/k"), PUB).unwrap();
    std::thread::sleep(SETTLED + Duration::from_millis(100));
    assert!(pki.read_slot_token(Folder::Accepted, "k").1.is_some());
    pki.folders[0].write().unwrap().local = false;
    let (slot, token) = pki.read_slot_token(Folder::Accepted, "k");
    assert!(matches!(slot, Slot::Key(_)) && token.is_none(), "{slot:?} {token:?}");
}
