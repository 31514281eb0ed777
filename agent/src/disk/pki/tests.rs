//! The key folders' contract: safe reads, staged and adopted writes,
//! parallel writers, `.dfn`.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;

use super::adopt::Adoption;
use super::read::read_key_bytes;
use super::*;
use crate::core::keyfile::MAX_KEY_BYTES;
use crate::core::settle::FsChange;
use crate::core::{Decision, MinionId, Verdict, Version};
use crate::core::{PublicKey, Slot};
use keysync_machine::testkit::PUB;

/// Opens the key folders in `dir` (created) as the agent does.
pub(crate) fn open(dir: &Path) -> Pki {
    let owner = Owner::of_path(dir).unwrap();
    let options = PkiOptions { owner, trust: Trust::of(owner.uid, owner.gid), key_mode: KEY_MODE, create: true };
    Pki::open(dir, options).unwrap()
}

pub(super) fn setup() -> (tempfile::TempDir, Pki) {
    let dir = tempfile::tempdir().unwrap();
    let pki = open(dir.path());
    (dir, pki)
}

fn decision(verdict: Verdict) -> Decision {
    Decision {
        id: MinionId::parse("web01").unwrap(),
        verdict,
        version: Version::new(1, "a"),
        context: Default::default(),
        relays: Default::default(),
        reached: Default::default(),
    }
}

#[test]
fn apply_moves_the_id_between_folders() {
    let (dir, pki) = setup();
    let other = PUB.replace("mwIDAQAB", "mwIDAQAC");
    fs::write(dir.path().join("minions_pre/web01"), &other).unwrap();
    let key = PublicKey::new(PUB.as_bytes());
    let applied = pki.apply(&decision(Verdict::Accepted(key.clone()))).unwrap();
    assert_eq!(applied.discarded_pending.unwrap().bytes(), other.as_bytes());
    assert_eq!(applied.changes, [(Folder::Accepted, FsChange::MovedIn), (Folder::Pending, FsChange::Gone)]);
    assert_eq!(fs::read(dir.path().join("minions/web01")).unwrap(), PUB.as_bytes());
    let mode = fs::metadata(dir.path().join("minions/web01")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, KEY_MODE);
    assert_eq!(pki.read_slot(Folder::Pending, decision(Verdict::Deleted).id.as_str()), Slot::Absent);

    let applied = pki.apply(&decision(Verdict::Rejected(key))).unwrap();
    assert_eq!(applied.changes, [(Folder::Rejected, FsChange::MovedIn), (Folder::Accepted, FsChange::Gone)]);
    assert!(!dir.path().join("minions/web01").exists());
    assert!(dir.path().join("minions_rejected/web01").exists());
    let applied = pki.apply(&decision(Verdict::Deleted)).unwrap();
    assert_eq!(applied.changes, [(Folder::Rejected, FsChange::Gone)], "only what was there is removed");
    assert!(pki.list().unwrap().is_empty(), "no staging file or key left");
    assert_eq!(fs::read_dir(dir.path().join(STAGING_DIR)).unwrap().count(), 0, "staging folder empty");
    pki.sync().unwrap();
}

#[test]
fn a_pending_file_holding_the_decided_key_is_moved_not_copied() {
    let (dir, pki) = setup();
    let pending = dir.path().join("minions_pre/web01");
    fs::write(&pending, PUB).unwrap();
    fs::set_permissions(&pending, fs::Permissions::from_mode(0o600)).unwrap();
    let ino = fs::metadata(&pending).unwrap().ino();
    let key = PublicKey::new(PUB.as_bytes());
    let applied = pki.apply(&decision(Verdict::Accepted(key.clone()))).unwrap();
    assert!(applied.discarded_pending.is_none());
    assert_eq!(applied.changes, [(Folder::Accepted, FsChange::Written), (Folder::Pending, FsChange::Gone)]);
    let accepted = fs::metadata(dir.path().join("minions/web01")).unwrap();
    assert_eq!(accepted.ino(), ino, "the pending file itself, linked into place");
    assert_eq!(accepted.permissions().mode() & 0o777, KEY_MODE);
    assert!(!pending.exists());

    // Rejecting moves it on the same way only from minions_pre/: from
    // minions/ the key is written anew.
    fs::write(&pending, PUB).unwrap();
    let ino = fs::metadata(&pending).unwrap().ino();
    pki.apply(&decision(Verdict::Rejected(key))).unwrap();
    assert_eq!(fs::metadata(dir.path().join("minions_rejected/web01")).unwrap().ino(), ino);
    assert_eq!(pki.list().unwrap(), vec![(Folder::Rejected, "web01".to_string())]);

    let left: Vec<_> = fs::read_dir(dir.path().join(STAGING_DIR)).unwrap().collect();
    assert!(left.is_empty(), "a link stages nothing: {left:?}");

    // Where no link can be made it is renamed: a writer of a large batch
    // passes it through its own staging folder, made at its first use, and
    // leaves nothing there.
    pki.no_link.store(true, Ordering::Relaxed);
    pki.apply(&decision(Verdict::Deleted)).unwrap();
    fs::write(&pending, PUB).unwrap();
    let ino = fs::metadata(&pending).unwrap().ino();
    let applied = pki.apply_in(&decision(Verdict::Accepted(PublicKey::new(PUB.as_bytes()))), 2, None).unwrap();
    assert_eq!(applied.changes, [(Folder::Pending, FsChange::Gone), (Folder::Accepted, FsChange::MovedIn)]);
    assert_eq!(fs::metadata(dir.path().join("minions/web01")).unwrap().ino(), ino);
    let writer = dir.path().join(STAGING_DIR).join("writer-2");
    assert_eq!(fs::read_dir(&writer).unwrap().count(), 0, "nothing left in {}", writer.display());
    assert_eq!(pki.list().unwrap(), vec![(Folder::Accepted, "web01".to_string())]);
}

#[test]
fn a_pending_file_swapped_after_it_was_read_is_never_moved_into_place() {
    let (dir, pki) = setup();
    let key = PublicKey::new(PUB.as_bytes());
    let pending = dir.path().join("minions_pre/web01");
    let accepted = dir.path().join("minions/web01");
    fs::write(dir.path().join("master.pem"), "-----BEGIN RSA PRIVATE KEY-----\n").unwrap();
    let swaps: [&dyn Fn(); 2] = [
        // Another file with the same bytes: not the inode that was read.
        &|| {
            fs::write(dir.path().join("other"), PUB).unwrap();
            fs::rename(dir.path().join("other"), &pending).unwrap();
        },
        // A symbolic link to the master's private key.
        &|| {
            fs::remove_file(&pending).unwrap();
            std::os::unix::fs::symlink("../master.pem", &pending).unwrap();
        },
    ];
    // Reads the pending key, swaps something in under its name, adopts.
    let swapped_then_adopted = |swap: &dyn Fn()| {
        fs::write(&pending, PUB).unwrap();
        let (slot, file) = pki.open_slot(Folder::Pending, "web01");
        assert!(matches!(slot, Slot::Key(_)));
        swap();
        let mut changes = Vec::new();
        let (accepted, pending) = (pki.folder_fd(Folder::Accepted).unwrap(), pki.folder_fd(Folder::Pending).unwrap());
        let adopted =
            pki.adopt_pending(file.unwrap(), (Folder::Accepted, &accepted), &pending, "web01", &key, 0, &mut changes);
        (adopted, changes)
    };
    // Adopted by a link: only the inode that was read can be linked, and it
    // has no name left once swapped out; nothing is adopted (the caller
    // writes the key and removes the pending name).
    for swap in swaps {
        let (adopted, changes) = swapped_then_adopted(swap);
        assert_eq!(adopted, Adoption::No);
        assert_eq!(changes, []);
        assert!(!accepted.exists(), "nothing linked into minions/");
        fs::remove_file(&pending).unwrap();
    }
    assert!(!pki.no_link.load(Ordering::Relaxed), "a swap is no reason to stop linking");
    // A file with another name too is not linked (the agent's reads refuse
    // hard-linked keys).
    let (adopted, changes) = swapped_then_adopted(&|| fs::hard_link(&pending, dir.path().join("elsewhere")).unwrap());
    assert_eq!((adopted, changes), (Adoption::No, vec![]));
    assert!(!accepted.exists());
    fs::remove_file(&pending).unwrap();

    // Adopted by renaming (no link possible): the file under the pending
    // name is checked after the rename, and never moved on if swapped.
    pki.no_link.store(true, Ordering::Relaxed);
    for swap in swaps {
        let (adopted, changes) = swapped_then_adopted(swap);
        assert_eq!(adopted, Adoption::No);
        assert_eq!(changes, [(Folder::Pending, FsChange::Gone)], "it left minions_pre/, never arrived");
        assert!(!accepted.exists(), "nothing moved into minions/");
        let left: Vec<_> = fs::read_dir(dir.path().join("minions_pre")).unwrap().collect();
        assert!(left.is_empty(), "the swapped-in file is gone from minions_pre/: {left:?}");
        let staged: Vec<_> = fs::read_dir(dir.path().join(STAGING_DIR)).unwrap().collect();
        assert!(staged.is_empty(), "the swapped-in file is removed, no private name left: {staged:?}");
    }
    assert!(dir.path().join("master.pem").exists());
    // The caller then writes the key itself.
    pki.apply(&decision(Verdict::Accepted(key))).unwrap();
    assert_eq!(fs::read(dir.path().join("minions/web01")).unwrap(), PUB.as_bytes());
}

/// `n` decisions of `key` for ids `m0000`…, one in three rejected.
pub(super) fn batch(n: usize, key: &PublicKey) -> Vec<Decision> {
    (0..n)
        .map(|i| Decision {
            id: MinionId::parse(&format!("m{i:04}")).unwrap(),
            verdict: if i % 3 == 0 { Verdict::Rejected(key.clone()) } else { Verdict::Accepted(key.clone()) },
            version: Version::new(1, "a"),
            context: Default::default(),
            relays: Default::default(),
            reached: Default::default(),
        })
        .collect()
}

#[test]
fn a_large_batch_is_written_by_several_writers_in_order() {
    let (dir, pki) = setup();
    let key = PublicKey::new(PUB.as_bytes());
    let n = PARALLEL_FROM * 2 + 3;
    let decisions = batch(n, &key);
    // One of them finds a different key pending: reported at its own place.
    let other = PUB.replace("mwIDAQAB", "mwIDAQAC");
    fs::write(dir.path().join("minions_pre/m0101"), &other).unwrap();
    let results = pki.apply_by(&decisions.iter().collect::<Vec<_>>(), 3, None);
    assert_eq!(results.len(), n);
    for (i, result) in results.iter().enumerate() {
        let applied = result.as_ref().unwrap();
        assert_eq!(applied.discarded_pending.is_some(), i == 101, "m{i:04}");
    }
    let listed = pki.list().unwrap();
    assert_eq!(listed.len(), n);
    assert_eq!(listed.iter().filter(|(folder, _)| *folder == Folder::Rejected).count(), n.div_ceil(3));
    assert_eq!(fs::read(dir.path().join("minions/m0001")).unwrap(), PUB.as_bytes());
    let staging = dir.path().join(STAGING_DIR);
    let writer_dirs: Vec<_> = fs::read_dir(&staging).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(writer_dirs.len(), 2, "writers 1 and 2 staged in folders of their own");
    for writer in &writer_dirs {
        assert_eq!(fs::read_dir(writer).unwrap().count(), 0, "{} left files", writer.display());
    }
    // A crash's leftovers in a writer's folder are cleaned at start.
    fs::write(writer_dirs[0].join(".keysync-1-1"), "x").unwrap();
    assert_eq!(pki.clean_staging().unwrap(), 1);
}

#[test]
fn reads_refuse_what_is_not_a_plain_public_key() {
    let (dir, pki) = setup();
    let accepted = dir.path().join("minions");
    fs::write(dir.path().join("master.pem"), "-----BEGIN RSA PRIVATE KEY-----\n").unwrap();
    std::os::unix::fs::symlink("../master.pem", accepted.join("link")).unwrap();
    fs::hard_link(dir.path().join("master.pem"), accepted.join("hard")).unwrap();
    fs::create_dir(accepted.join("dir")).unwrap();
    fs::write(accepted.join("big"), vec![b'A'; MAX_KEY_BYTES + 10]).unwrap();
    fs::write(accepted.join("master.pub"), PUB).unwrap();
    fs::write(accepted.join("good"), PUB).unwrap();
    let refused = |name: &str| match pki.read_slot(Folder::Accepted, name) {
        Slot::Refused(reason) => reason.to_string(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(refused("link"), "not a regular file (symbolic link)");
    assert_eq!(refused("hard"), "a hard link with 2 names (could be another key file)");
    assert_eq!(refused("dir"), "not a regular file (directory)");
    assert!(refused("big").contains("more than the 16384 byte limit"));
    assert!(refused("master.pub").contains("master key file"));
    assert_eq!(pki.read_slot(Folder::Pending, "master.pub"), Slot::Absent, "refused only where it is");
    assert!(matches!(pki.read_slot(Folder::Accepted, "good"), Slot::Key(_)));
    assert_eq!(pki.read_slot(Folder::Accepted, "missing"), Slot::Absent);
}

#[test]
fn dfn_is_dropped_once_with_salts_mode() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::of_path(dir.path()).unwrap();
    let trust = Trust::of(owner.uid, owner.gid);
    assert!(drop_dfn(dir.path(), "m1_master", owner, &trust).unwrap());
    assert!(!drop_dfn(dir.path(), "m1_master", owner, &trust).unwrap());
    let meta = fs::metadata(dir.path().join(".dfn")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o400);
    assert_eq!(fs::read(dir.path().join(".dfn")).unwrap(), b"m1_master");
    assert_eq!(meta.nlink(), 1, "the staging name is gone");
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// What an apply says it changed is exactly what the watcher then hears
/// (dot files aside, which the settler ignores): the echo list depends on it.
#[test]
fn the_changes_an_apply_reports_are_the_events_the_watcher_hears() {
    let (dir, pki) = setup();
    let (_watch, mut events) = crate::disk::watcher::watch(dir.path()).unwrap();
    let pending = dir.path().join("minions_pre/web01");
    let key = PublicKey::new(PUB.as_bytes());
    let other = PUB.replace("mwIDAQAB", "mwIDAQAC");
    let cases: [(&str, &dyn Fn(), Verdict); 5] = [
        ("linked", &|| fs::write(&pending, PUB).unwrap(), Verdict::Accepted(key.clone())),
        ("another key pending", &|| fs::write(&pending, &other).unwrap(), Verdict::Rejected(key.clone())),
        ("moved", &|| {}, Verdict::Accepted(key.clone())),
        ("deleted", &|| {}, Verdict::Deleted),
        ("renamed", &|| pki.no_link.store(true, Ordering::Relaxed), Verdict::Accepted(key.clone())),
    ];
    for (case, prepare, verdict) in cases {
        prepare();
        if case == "renamed" {
            pki.apply(&decision(Verdict::Deleted)).unwrap();
            fs::write(&pending, PUB).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        while events.try_recv().is_ok() {}
        let applied = pki.apply(&decision(verdict)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (mut heard, mut dot_files) = (Vec::new(), false);
        while let Ok(event) = events.try_recv() {
            match event {
                crate::disk::watcher::WatchEvent::Change { name, .. } if name.starts_with('.') => dot_files = true,
                crate::disk::watcher::WatchEvent::Change { folder, change, .. } => heard.push((folder, change)),
                crate::disk::watcher::WatchEvent::Rescan(reason) => panic!("{case}: rescan: {reason}"),
            }
        }
        assert_eq!(heard, applied.changes, "{case}");
        assert!(!applied.changes.is_empty(), "{case}");
        // Never staged in a watched folder.
        assert!(!dot_files, "{case}: a staging file in a watched folder");
    }
}

/// Issue 14: a key folder that is a symlink (`minions_rejected ->
/// /etc/cron.hourly`) is refused at start, and one swapped for a symlink
/// while the agent runs is refused then: nothing is created, changed or
/// removed outside pki_dir, and the other folders keep being served.
#[test]
fn nothing_outside_pki_dir_through_a_symlinked_key_folder() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("web01"), "precious").unwrap();
    let pki_dir = dir.path().join("pki");
    fs::create_dir_all(pki_dir.join("minions")).unwrap();
    fs::create_dir_all(pki_dir.join("minions_pre")).unwrap();
    std::os::unix::fs::symlink(outside.path(), pki_dir.join("minions_rejected")).unwrap();
    let owner = Owner::of_path(dir.path()).unwrap();
    let options = PkiOptions { owner, trust: Trust::of(owner.uid, owner.gid), key_mode: KEY_MODE, create: true };
    let err = Pki::open(&pki_dir, options).err().expect("refused at start");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    let (problems, _) = inspect(&pki_dir, &options.trust);
    assert!(problems.iter().any(|p| p.contains("minions_rejected") && p.contains("symbolic link")), "{problems:?}");

    // At run time: minions_pre and minions_rejected swapped for symlinks.
    fs::remove_file(pki_dir.join("minions_rejected")).unwrap();
    fs::create_dir(pki_dir.join("minions_rejected")).unwrap();
    let pki = Pki::open(&pki_dir, options).unwrap();
    fs::rename(pki_dir.join("minions_pre"), dir.path().join("old_pre")).unwrap();
    std::os::unix::fs::symlink(outside.path(), pki_dir.join("minions_pre")).unwrap();
    fs::rename(pki_dir.join("minions_rejected"), dir.path().join("old_rejected")).unwrap();
    std::os::unix::fs::symlink(outside.path(), pki_dir.join("minions_rejected")).unwrap();
    let key = PublicKey::new(PUB.as_bytes());
    let err = pki.apply(&decision(Verdict::Rejected(key.clone()))).unwrap_err();
    assert!(err.to_string().contains("replaced and is refused"), "{err}");
    assert_eq!(fs::read(outside.path().join("web01")).unwrap(), b"precious", "nothing unlinked or written outside");
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 1, "nothing created outside");
    let replaced = pki.take_replaced();
    assert_eq!(
        replaced.iter().map(|r| (r.folder, r.outcome.is_ok())).collect::<Vec<_>>(),
        [(Folder::Pending, false), (Folder::Rejected, false)]
    );
    assert!(pki.take_replaced().is_empty(), "told once");
    // Reads of a refused folder say so (no conclusion drawn), the rest is served.
    assert!(matches!(pki.read_slot(Folder::Rejected, "web01"), Slot::Refused(_)));
    fs::write(pki_dir.join("minions/web02"), PUB).unwrap();
    assert!(matches!(pki.read_slot(Folder::Accepted, "web02"), Slot::Key(_)));
    assert_eq!(pki.list().unwrap(), vec![(Folder::Accepted, "web02".to_string())]);

    // A folder replaced by a plain folder of a trusted owner is reopened.
    fs::remove_file(pki_dir.join("minions_pre")).unwrap();
    fs::create_dir(pki_dir.join("minions_pre")).unwrap();
    fs::write(pki_dir.join("minions_pre/web03"), PUB).unwrap();
    pki.check_folders();
    assert_eq!(pki.take_replaced(), vec![Replaced { folder: Folder::Pending, outcome: Ok(()) }]);
    assert!(matches!(pki.read_slot(Folder::Pending, "web03"), Slot::Key(_)));
}

/// Issue 14: the staging folder is the agent's alone. One the salt user put
/// there (holding a symlink at any name the agent might use) or a symlink
/// in its place is moved aside and a private one made; the marker's
/// temporary file never follows a symlink, so no file outside is truncated.
#[test]
fn a_staging_folder_that_is_not_the_agents_own_is_never_used() {
    for planted in ["folder of another user", "symlink"] {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "root's file").unwrap();
        let pki_dir = dir.path().join("pki");
        fs::create_dir(&pki_dir).unwrap();
        let staging = pki_dir.join(STAGING_DIR);
        if planted == "symlink" {
            fs::create_dir(dir.path().join("elsewhere")).unwrap();
            std::os::unix::fs::symlink(dir.path().join("elsewhere"), &staging).unwrap();
        } else {
            fs::create_dir(&staging).unwrap();
            for name in [".salt-keysync-state.tmp", ".salt-keysync-state", "writer-1"] {
                std::os::unix::fs::symlink(&victim, staging.join(name)).unwrap();
            }
            rustix::fs::chown(&staging, Some(rustix::fs::Uid::from_raw(4242)), None).unwrap();
        }
        let owner = Owner::of_path(dir.path()).unwrap();
        let (_, notes) = inspect(&pki_dir, &Trust::of(owner.uid, owner.gid));
        assert!(notes.iter().any(|n| n.contains("moves it aside")), "{planted}: {notes:?}");
        let pki = open(&pki_dir);
        assert!(pki.staging_refused().is_some_and(|r| r.contains("moved aside")), "{planted}");
        pki.write_marker("store x\nnode a\n").unwrap();
        let key = PublicKey::new(PUB.as_bytes());
        let big: Vec<Decision> = (0..PARALLEL_FROM)
            .map(|i| Decision {
                id: MinionId::parse(&format!("m{i}")).unwrap(),
                ..decision(Verdict::Accepted(key.clone()))
            })
            .collect();
        assert!(pki.apply_by(&big.iter().collect::<Vec<_>>(), 2, None).iter().all(Result::is_ok));
        assert_eq!(fs::read(&victim).unwrap(), b"root's file", "{planted}: nothing written through a symlink");
        let meta = fs::symlink_metadata(&staging).unwrap();
        assert!(meta.is_dir() && meta.permissions().mode() & 0o7777 == 0o700, "{planted}: a private folder");
        assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
        assert_eq!(pki.read_marker().unwrap().as_deref(), Some("store x\nnode a\n"));
    }
}

/// The mode the master's own salt-key gives key files, by Salt line.
#[test]
fn key_files_get_the_mode_of_the_masters_salt_line() {
    assert_eq!(super::key_mode_for("3008.3"), Some(0o600));
    assert_eq!(super::key_mode_for("3009.0"), Some(0o600));
    assert_eq!(super::key_mode_for("3007.15"), Some(0o644));
    assert_eq!(super::key_mode_for("3006.28"), Some(0o644));
    assert_eq!(super::key_mode_for("unknown"), None);
}

/// A key written after the mode changed gets the new mode (an adopted
/// pending key too).
#[test]
fn a_changed_key_mode_applies_to_the_next_writes() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let pki = open(dir.path());
    pki.set_key_mode(0o600);
    let id = crate::core::MinionId::parse("web01").unwrap();
    let decision = crate::core::Decision {
        id: id.clone(),
        verdict: crate::core::Verdict::Accepted(crate::core::PublicKey::new(keysync_machine::testkit::PUB.as_bytes())),
        version: crate::core::Version::new(1 << 50, "a"),
        context: Default::default(),
        relays: Default::default(),
        reached: Default::default(),
    };
    pki.apply(&decision).unwrap();
    let mode = std::fs::metadata(dir.path().join("minions/web01")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// Issue 29 item 6: key files earlier releases wrote 0644 stayed 0644 after
/// an upgrade on Salt 3008 (which writes 0600). Once the mode is 0600 they
/// are narrowed, through their own descriptors: never a symlink's target, a
/// hard link's other name, a pending key, or widened.
#[test]
fn key_files_left_wider_than_salt_writes_them_are_narrowed_once_the_mode_is_known() {
    let (dir, pki) = setup();
    let p = |folder: &str, name: &str| dir.path().join(folder).join(name);
    for (folder, name, mode) in [
        ("minions", "old01", 0o644),
        ("minions", "new01", 0o600),
        ("minions_rejected", "old02", 0o640),
        ("minions_pre", "pending01", 0o644),
    ] {
        fs::write(p(folder, name), PUB).unwrap();
        fs::set_permissions(p(folder, name), fs::Permissions::from_mode(mode)).unwrap();
    }
    let outside = dir.path().join("outside");
    fs::write(&outside, "x").unwrap();
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&outside, p("minions", "link01")).unwrap();
    let shared = dir.path().join("shared");
    fs::write(&shared, PUB).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o644)).unwrap();
    fs::hard_link(&shared, p("minions", "hard01")).unwrap();
    let mode = |path: &Path| fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777;

    assert_eq!(pki.narrow_key_modes(), (0, 0), "the mode is 0644 (Salt before 3008): nothing to narrow");
    pki.set_key_mode(KEY_MODE_3008);
    assert_eq!(pki.narrow_key_modes(), (2, 0));
    assert_eq!(mode(&p("minions", "old01")), 0o600);
    assert_eq!(mode(&p("minions_rejected", "old02")), 0o600);
    assert_eq!(mode(&p("minions", "new01")), 0o600);
    assert_eq!(mode(&p("minions_pre", "pending01")), 0o644, "pending keys are the master's");
    assert_eq!(mode(&outside), 0o644, "a symlink is not followed");
    assert_eq!(mode(&shared), 0o644, "a hard link's other name is not touched");
    assert_eq!(pki.narrow_key_modes(), (0, 0), "once");
}

/// Issue 28 item 5: a missing `minions_pre` failed `check` while `run`
/// makes it. `check` now says the agent makes it, and `run` does.
#[test]
fn a_missing_key_folder_is_a_note_for_check_and_made_by_run() {
    let dir = tempfile::tempdir().unwrap();
    let pki_dir = dir.path().join("pki");
    fs::create_dir_all(pki_dir.join("minions")).unwrap();
    fs::create_dir_all(pki_dir.join("minions_rejected")).unwrap();
    let owner = Owner::of_path(dir.path()).unwrap();
    let (problems, notes) = inspect(&pki_dir, &Trust::of(owner.uid, owner.gid));
    assert!(problems.is_empty(), "{problems:?}");
    assert!(notes.iter().any(|n| n.contains("minions_pre is missing: the agent makes it at start")), "{notes:?}");
    let options = PkiOptions { owner, trust: Trust::of(owner.uid, owner.gid), key_mode: KEY_MODE, create: true };
    Pki::open(&pki_dir, options).unwrap();
    assert!(pki_dir.join("minions_pre").is_dir(), "run makes it");
}

/// Reading a key leaves its access time alone (`O_NOATIME`): a first read
/// of each file written since its last read dirtied its inode, 1,000,000
/// inode writes at a first start. (Its atime is set before its mtime, so
/// a `relatime` mount would update it on a read.)
#[test]
fn reading_a_key_leaves_its_access_time() {
    let (dir, pki) = setup();
    let path = dir.path().join("minions/web01");
    fs::write(&path, PUB).unwrap();
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    fs::File::options().write(true).open(&path).unwrap().set_times(fs::FileTimes::new().set_accessed(old)).unwrap();
    assert!(matches!(pki.read_slot(Folder::Accepted, "web01"), Slot::Key(_)));
    assert_eq!(fs::metadata(&path).unwrap().accessed().unwrap(), old);
}

/// A key file the agent may not open with `O_NOATIME` (another user's, and
/// the agent without CAP_FOWNER: as the agent running as `salt` reads what
/// `salt-key` run as root wrote) is read all the same, and the flag is
/// not asked for again.
#[test]
fn a_key_the_agent_may_not_open_leaving_its_access_time_is_read_all_the_same() {
    use rustix::thread::{capabilities, set_capabilities, CapabilitySet};
    let (dir, pki) = setup();
    for name in ["web01", "web02"] {
        let path = dir.path().join("minions").join(name);
        fs::write(&path, PUB).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // Capabilities are a thread's own: only this one loses CAP_FOWNER.
                let mut caps = capabilities(None).unwrap();
                caps.effective.remove(CapabilitySet::FOWNER);
                set_capabilities(None, caps).unwrap();
                let denied = rustix::fs::open(
                    dir.path().join("minions/web01").as_path(),
                    rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOATIME,
                    rustix::fs::Mode::empty(),
                );
                assert_eq!(denied.err(), Some(rustix::io::Errno::PERM), "the kernel refuses O_NOATIME here");
                for name in ["web01", "web02"] {
                    match pki.read_slot(Folder::Accepted, name) {
                        Slot::Key(key) => assert_eq!(key.bytes(), PUB.as_bytes()),
                        other => panic!("{name}: {other:?}"),
                    }
                }
            })
            .join()
            .unwrap();
    });
    assert!(pki.no_noatime.load(Ordering::Relaxed), "O_NOATIME is no longer asked for");
}

/// A key file read in one go: as fstat sized it, grown since (read on, up
/// to one byte over the cap), shrunk since (to its end).
#[test]
fn a_key_file_is_read_whole_whatever_its_size_became() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k");
    // Asked first not to wait for the disk, or not.
    let cold = super::read::ColdReads::default();
    let read = |bytes: &[u8], size: usize| {
        fs::write(&path, bytes).unwrap();
        let plain = read_key_bytes(&mut fs::File::open(&path).unwrap(), size).unwrap();
        let noting = super::read::read_noting(&mut fs::File::open(&path).unwrap(), size, Some(&cold)).unwrap();
        assert_eq!(plain, noting, "{} bytes, sized {size}", bytes.len());
        plain
    };
    let key = PUB.as_bytes();
    assert_eq!(read(key, key.len()), key, "as sized");
    assert_eq!(read(key, 10), key, "grown since");
    assert_eq!(read(&key[..100], key.len()), &key[..100], "shrunk since");
    assert_eq!(read(b"", 0), b"", "empty");
    let huge = vec![b'x'; 3 * MAX_KEY_BYTES];
    assert_eq!(read(&huge, 10).len(), MAX_KEY_BYTES + 1, "grown past the cap: one byte over, no more");
}
