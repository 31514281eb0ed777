//! Key files a scan read and decided nothing on are not read again while
//! they are the same files (`FileToken`): the periodic rescan and the reads
//! after lost events ask whether each is unchanged, and read only those
//! that are not; a change heard, a decision, and every hour, read all.

use super::guard::at;
use super::*;
use crate::core::Folder;
use crate::node::local::{FULL_READ_EVERY, RESCAN_STEP};

fn tick_until(node: &mut Node, rt: &mut Recorder, base: Instant, until: f64) {
    for _ in 0..1000 {
        let Some(due) = node.poll_at().filter(|due| *due <= base + Duration::from_secs_f64(until)) else { return };
        node.on_tick(at(base, due.saturating_duration_since(base).as_secs_f64()), rt);
    }
    panic!("still due after 1000 ticks: {:?}", node.waits().collect::<Vec<_>>());
}

/// The folders `name`'s files were read in since the log began.
fn reads_of(rt: &Recorder, name: &str) -> Vec<Folder> {
    let log = rt.read_log.as_deref().unwrap_or_default();
    log.iter().filter(|(soon, _, n)| !soon && n == name).map(|(_, folder, _)| *folder).collect()
}

fn fingerprint_of(node: &Node, name: &str) -> Option<crate::core::Fingerprint> {
    node.entry(&MinionId::parse(name).unwrap()).and_then(|entry| entry.fingerprint)
}

#[test]
fn a_scan_reads_again_only_the_key_files_not_the_ones_it_read() {
    const INTERVAL: f64 = 600.0;
    let n = 2 * RESCAN_STEP + 10;
    let mut rt = Recorder { file_tokens: true, ..Recorder::default() };
    for i in 0..n {
        let folder = if i % 20 == 0 { Folder::Rejected } else { Folder::Accepted };
        rt.folders.put(folder, &format!("k{i:06}"), PUB.as_bytes());
    }
    // An id with two files: never taken for unchanged.
    rt.folders.put(Folder::Pending, "k000001", PUB.as_bytes());
    let base = Instant::now();
    let unguarded = GuardSettings { enabled: false, ..Default::default() };
    let settings = Settings { rescan_interval: Duration::from_secs_f64(INTERVAL), ..settings("master-a", unguarded) };
    let mut node = Node::start(settings, Loaded::default(), at(base, 0.0), &mut rt);
    assert_eq!(rt.files_read, n + 1, "each file once at the first start");

    // The first periodic rescan reads every file: a first start's reads
    // are claims, and take no token.
    rt.files_read = 0;
    tick_until(&mut node, &mut rt, base, INTERVAL + 1.0);
    assert_eq!((rt.files_read, rt.files_asked), (n + 1, 0));

    // Unseen by the node (its events lost): a key copied over another in
    // place, and a key file gone.
    let other = PUB.replace("mwIDAQAB", "mwIDAQAC");
    let other_fingerprint = PublicKey::new(other.as_bytes()).fingerprint();
    rt.folders.put(Folder::Accepted, "k000002", other.as_bytes());
    assert!(rt.folders.remove(Folder::Accepted, "k000003"));
    rt.files_read = 0;
    rt.read_log = Some(Vec::new());
    tick_until(&mut node, &mut rt, base, 2.0 * INTERVAL + 2.0);
    // Read: both files of k000001, the changed k000002 (and, as it decides
    // something, again in all three folders), and k000003 (listed nowhere,
    // held) in all three. Every other id is asked about and not read.
    assert_eq!(rt.files_read, 2 + (1 + 3) + 3, "{:?}", rt.read_log);
    assert_eq!(rt.files_asked, n - 2);
    assert_eq!(fingerprint_of(&node, "k000002"), Some(other_fingerprint), "the key copied over is decided");
    let k3 = node.entry(&MinionId::parse("k000003").unwrap()).map(|e| e.kind);
    assert_eq!(k3, Some(crate::core::VerdictKind::Deleted));

    // A change heard is read in full, token or not.
    rt.read_log = Some(Vec::new());
    let t = 2.0 * INTERVAL + 50.0;
    let heard = |change| FsEvent { folder: Folder::Accepted, name: "k000006".to_string(), change };
    node.on_fs(&heard(crate::core::settle::FsChange::Written), at(base, t));
    node.on_fs(&heard(crate::core::settle::FsChange::Closed), at(base, t));
    tick_until(&mut node, &mut rt, base, t + 10.0);
    assert_eq!(reads_of(&rt, "k000006"), Folder::ALL);

    // Events lost: each name is read again once settled, in all three
    // folders, but a key file unchanged only asked about. k000002's entry
    // changed with its decision: its new file is read.
    rt.read_log = Some(Vec::new());
    node.on_lost("test", at(base, t + 20.0), &mut rt);
    tick_until(&mut node, &mut rt, base, t + 30.0);
    assert_eq!(reads_of(&rt, "k000005"), [Folder::Pending, Folder::Rejected]);
    assert_eq!(reads_of(&rt, "k000002"), Folder::ALL);
    // Nor are the unchanged files asked for ahead of the reads.
    let log = rt.read_log.as_deref().unwrap_or_default();
    assert!(!log.iter().any(|(soon, _, name)| *soon && name == "k000005"));

    // A change found whose recording fails is read again by the retry.
    rt.folders.put(Folder::Accepted, "k000007", other.as_bytes());
    rt.faults.record = true;
    tick_until(&mut node, &mut rt, base, 3.0 * INTERVAL + 3.0);
    assert_ne!(fingerprint_of(&node, "k000007"), Some(other_fingerprint));
    rt.faults.record = false;
    tick_until(&mut node, &mut rt, base, 3.0 * INTERVAL + 300.0);
    assert_eq!(fingerprint_of(&node, "k000007"), Some(other_fingerprint), "decided once the store records");

    // Every key file is read again by the first periodic rescan
    // FULL_READ_EVERY or more after the start.
    rt.read_log = Some(Vec::new());
    let full = FULL_READ_EVERY.as_secs_f64();
    tick_until(&mut node, &mut rt, base, full - 1.0);
    assert_eq!(reads_of(&rt, "k000005"), [], "not read in the rescans before the hour");
    tick_until(&mut node, &mut rt, base, full + INTERVAL + 1.0);
    assert_eq!(reads_of(&rt, "k000005"), [Folder::Accepted], "read in full once the hour is past");
}
