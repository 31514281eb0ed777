//! Key files a scan read and decided nothing on are not read again while
//! they are the same files (`FileToken`): the periodic rescan and the reads
//! after lost events ask whether each is unchanged, and read only those
//! that are not.

use super::guard::at;
use super::*;
use crate::core::Folder;
use crate::node::local::RESCAN_STEP;

fn tick_until(node: &mut Node, rt: &mut Recorder, base: Instant, until: f64) {
    for _ in 0..100 {
        let Some(due) = node.poll_at().filter(|due| *due <= base + Duration::from_secs_f64(until)) else { return };
        node.on_tick(at(base, due.saturating_duration_since(base).as_secs_f64()), rt);
    }
    panic!("still due after 100 ticks: {:?}", node.waits().collect::<Vec<_>>());
}

/// The files of `name` read since the log began (folder by folder).
fn reads_of<'a>(rt: &'a Recorder, name: &'a str) -> impl Iterator<Item = Folder> + 'a {
    let log = rt.read_log.as_deref().unwrap_or_default();
    log.iter().filter(move |(soon, _, n)| !soon && n == name).map(|(_, folder, _)| *folder)
}

#[test]
fn a_scan_reads_again_only_the_key_files_not_the_ones_it_read() {
    let n = 2 * RESCAN_STEP + 10;
    let mut rt = Recorder { file_tokens: true, ..Recorder::default() };
    for i in 0..n {
        let folder = if i % 20 == 0 { Folder::Rejected } else { Folder::Accepted };
        rt.folders.put(folder, &format!("k{i:06}"), PUB.as_bytes());
    }
    // An id with two files: never taken for unchanged.
    rt.folders.put(Folder::Pending, "k000001", PUB.as_bytes());
    let base = Instant::now();
    let mut node = node_at(
        "master-a",
        GuardSettings { enabled: false, ..Default::default() },
        Default::default(),
        at(base, 0.0),
        &mut rt,
    );
    assert_eq!(rt.files_read, n + 1, "each file once at the first start");

    // The first periodic rescan reads every file: a first start's reads
    // are claims, and take no token.
    rt.files_read = 0;
    tick_until(&mut node, &mut rt, base, 3601.0);
    assert_eq!((rt.files_read, rt.files_asked), (n + 1, 0));

    // Unseen by the node (its events lost): a key copied over another in
    // place, and a key file gone.
    let other = PUB.replace("mwIDAQAB", "mwIDAQAC");
    rt.folders.put(Folder::Accepted, "k000002", other.as_bytes());
    assert!(rt.folders.remove(Folder::Accepted, "k000003"));
    rt.files_read = 0;
    rt.read_log = Some(Vec::new());
    tick_until(&mut node, &mut rt, base, 7202.0);
    // Read: both files of k000001, the changed k000002 (and, as it decides
    // something, again in all three folders), and k000003 (listed nowhere,
    // held) in all three. Every other id is asked about and not read.
    assert_eq!(rt.files_read, 2 + (1 + 3) + 3, "{:?}", rt.read_log);
    assert_eq!(rt.files_asked, n - 2);
    let k2 = node.entry(&MinionId::parse("k000002").unwrap()).unwrap();
    assert_eq!(
        k2.fingerprint,
        Some(PublicKey::new(other.as_bytes().to_vec()).fingerprint()),
        "the key copied over is decided"
    );
    let k3 = node.entry(&MinionId::parse("k000003").unwrap()).map(|e| e.kind);
    assert_eq!(k3, Some(crate::core::VerdictKind::Deleted));

    // Events lost: each name is read again once settled, in all three
    // folders, but a key file unchanged only asked about. k000002's entry
    // changed with its decision: its new file is read again.
    rt.read_log = Some(Vec::new());
    node.on_lost("test", at(base, 7300.0), &mut rt);
    tick_until(&mut node, &mut rt, base, 7310.0);
    assert_eq!(reads_of(&rt, "k000005").collect::<Vec<_>>(), [Folder::Pending, Folder::Rejected]);
    assert_eq!(reads_of(&rt, "k000002").collect::<Vec<_>>(), Folder::ALL);
    // Nor are the unchanged files asked for ahead of the reads.
    let log = rt.read_log.as_deref().unwrap_or_default();
    assert!(!log.iter().any(|(soon, _, name)| *soon && name == "k000005"));
}
