//! The audit log's contract: the chain detects edits, removals and
//! reordering; rotation (rename and copytruncate) and torn lines keep it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::*;
use super::{Action, Outcome, Via};

fn minion(name: &str) -> Record {
    Record { minion: Some(name.into()), ..Record::new(Action::Accept, Via::Local, Outcome::Applied) }
}

/// A log at `path` with `n` records web1..webN.
fn write_log(path: &Path, n: usize) -> AuditLog {
    let log = AuditLog::open(path, "a").unwrap();
    for i in 1..=n {
        log.record(minion(&format!("web{i}")));
    }
    log
}

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap().lines().map(str::to_string).collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
}

fn broken(paths: &[PathBuf]) -> Break {
    verify_files(paths).unwrap().broken.expect("the chain should be broken")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

#[test]
fn chain_survives_reopening_and_modes_are_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log/audit.jsonl");
    drop(write_log(&path, 1));
    let dir_mode = std::fs::metadata(dir.path().join("log")).unwrap().permissions().mode() & 0o777;
    assert_eq!(dir_mode, 0o700);
    let log = AuditLog::open(&path, "a").unwrap();
    log.record(Record {
        minion: Some("web02".into()),
        ..Record::new(Action::Reject, Via::Peer(&keysync_machine::testkit::peer("b")), Outcome::Applied)
    });
    let records = read_verified(&path).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].prev, GENESIS);
    assert_eq!((records[0].seq, records[1].seq), (1, 2));
    assert_eq!(records[1].via, "b");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn an_edited_record_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    drop(write_log(&path, 5));
    let mut lines = lines_of(&path);
    lines[1] = lines[1].replace("web2", "evil");
    write_lines(&path, &lines);
    let bad = broken(std::slice::from_ref(&path));
    assert_eq!(bad.line, 2, "{bad:?}");
    assert!(bad.why.contains("this record was edited"), "{bad:?}");
    let err = read_verified(&path).unwrap_err().to_string();
    assert!(err.contains("line 2: this record was edited"), "{err}");
    // Reading without verifying still works.
    assert_eq!(read_all(&path).unwrap().len(), 5);
}

#[test]
fn an_edited_prev_names_its_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    drop(write_log(&path, 5));
    let mut lines = lines_of(&path);
    let record: Record = serde_json::from_str(&lines[2]).unwrap();
    lines[2] = lines[2].replace(&record.prev, &"f".repeat(64));
    write_lines(&path, &lines);
    let bad = broken(std::slice::from_ref(&path));
    assert_eq!(bad.line, 3, "{bad:?}");
    assert!(bad.why.contains("neither the line before nor the line after"), "{bad:?}");
}

#[test]
fn a_deleted_record_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    drop(write_log(&path, 5));
    let mut lines = lines_of(&path);
    lines.remove(2);
    write_lines(&path, &lines);
    let bad = broken(std::slice::from_ref(&path));
    assert_eq!(bad.line, 3, "{bad:?}");
    assert!(bad.why.contains("records seq 3 is missing before this line: removed"), "{bad:?}");

    // Removing the first records is caught too: no rotation marker there.
    let mut lines = lines_of(&path);
    lines.remove(0);
    write_lines(&path, &lines);
    let bad = broken(std::slice::from_ref(&path));
    assert_eq!(bad.line, 1, "{bad:?}");
    assert!(bad.why.contains("records before it were removed"), "{bad:?}");
}

#[test]
fn reordered_records_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    drop(write_log(&path, 5));
    let mut lines = lines_of(&path);
    lines.swap(1, 2);
    write_lines(&path, &lines);
    let bad = broken(std::slice::from_ref(&path));
    assert_eq!(bad.line, 2, "{bad:?}");
    assert!(bad.why.contains("records out of order: seq 3 comes before seq 2 at"), "{bad:?}");
}

#[test]
fn a_line_that_is_not_a_record_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    drop(write_log(&path, 3));
    let mut lines = lines_of(&path);
    lines[1] = "garbage".into();
    write_lines(&path, &lines);
    let bad = broken(std::slice::from_ref(&path));
    assert_eq!(bad.line, 2, "{bad:?}");
    assert!(bad.why.starts_with("not a record"), "{bad:?}");
}

#[test]
fn copytruncate_keeps_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let rotated = with_suffix(&path, ".1");
    let log = write_log(&path, 3);
    // logrotate copytruncate: copy, then truncate in place while the agent writes on.
    std::fs::copy(&path, &rotated).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
    log.record(minion("web4"));
    log.record(minion("web5"));

    let new = read_all(&path).unwrap();
    assert_eq!(new.iter().map(|r| r.action.as_str()).collect::<Vec<_>>(), ["continue", "accept", "accept"]);
    assert_eq!(new[0].outcome, "rotated");
    assert!(new[0].reason.as_deref().unwrap().contains("truncated"), "{:?}", new[0]);
    let both = verify_files(&[rotated.clone(), path.clone()]).unwrap();
    assert_eq!((both.broken, both.n_records, both.notes.len()), (None, 6, 0));
    // The current file alone verifies, saying it continues a rotated file.
    let alone = verify_files(std::slice::from_ref(&path)).unwrap();
    assert_eq!(alone.broken, None);
    assert!(alone.notes[0].contains("continues from a rotated file"), "{:?}", alone.notes);
    // Files given in the wrong order do not chain.
    let bad = broken(&[path.clone(), rotated.clone()]);
    assert_eq!((bad.file, bad.line), (rotated, 1));
}

#[test]
fn rename_rotation_keeps_the_chain_with_and_without_create() {
    for create in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let rotated = with_suffix(&path, ".1");
        let log = write_log(&path, 2);
        std::fs::rename(&path, &rotated).unwrap();
        if create {
            std::fs::write(&path, b"").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        }
        log.record(minion("web3"));
        assert_eq!(read_all(&rotated).unwrap().len(), 2, "nothing more goes to the renamed file");
        let new = read_all(&path).unwrap();
        assert_eq!(new.len(), 2);
        assert_eq!((new[0].action.as_str(), new[1].minion.as_deref()), ("continue", Some("web3")));
        let report = verify_files(&[rotated.clone(), path.clone()]).unwrap();
        assert_eq!((report.broken, report.n_records), (None, 4), "create={create}");
        assert_eq!(new[1].seq, 4);
    }
}

#[test]
fn an_empty_log_at_start_continues_the_rotated_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let rotated = with_suffix(&path, ".1");
    drop(write_log(&path, 2));
    std::fs::rename(&path, &rotated).unwrap();
    drop(write_log(&path, 1));
    let report = verify_files(&[rotated, path.clone()]).unwrap();
    assert_eq!((report.broken, report.n_records), (None, 4));
    assert_eq!(read_all(&path).unwrap()[0].action, CONTINUE);
}

/// logrotate as packaged (`dateext`) names the rotated file
/// `audit.jsonl-YYYYMMDD`, not `audit.jsonl.1`: an empty log at start
/// continues whichever rotated file is newest, and verify's hint names it.
#[test]
fn an_empty_log_continues_the_newest_rotated_file_whatever_its_name() {
    for (older, newest) in [
        ("audit.jsonl-20261001", "audit.jsonl-20261101"),
        ("audit.jsonl.2", "audit.jsonl.1"),
        ("audit.jsonl-1761955200", "audit.jsonl-1764547200"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let (older, newest) = (dir.path().join(older), dir.path().join(newest));
        drop(write_log(&path, 2));
        std::fs::rename(&path, &older).unwrap();
        drop(write_log(&path, 1));
        std::fs::rename(&path, &newest).unwrap();
        // The older file was written before: by modification time too.
        let earlier = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
        std::fs::File::options().append(true).open(&older).unwrap().set_modified(earlier).unwrap();
        drop(write_log(&path, 1));
        assert_eq!(read_all(&path).unwrap()[0].action, CONTINUE, "{}", newest.display());
        let report = verify_files(&[older.clone(), newest.clone(), path.clone()]).unwrap();
        assert_eq!((report.broken, report.n_records), (None, 6), "{}", newest.display());
        let alone = verify_files(std::slice::from_ref(&path)).unwrap();
        let hint = format!("salt-keysync audit verify {} {}", newest.display(), path.display());
        assert!(alone.notes[0].contains(&hint), "{:?} should name {hint:?}", alone.notes);
    }
}

#[test]
fn a_new_chain_in_a_later_file_is_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (dir.path().join("old.jsonl"), dir.path().join("new.jsonl"));
    drop(write_log(&old, 2));
    drop(write_log(&new, 2));
    let report = verify_files(&[old, new]).unwrap();
    assert_eq!(report.broken, None);
    assert!(report.notes[0].contains("starts a new chain"), "{:?}", report.notes);
}

#[test]
fn a_torn_tail_is_tolerated_then_set_aside_and_the_chain_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    drop(write_log(&path, 3));
    let torn = b"{\"time\":\"2026-11-21T10:00:00Z\",\"node\":\"a\",\"act";
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(torn);
    std::fs::write(&path, &bytes).unwrap();

    // Readers: the three whole records, and a warning.
    assert_eq!(read_verified(&path).unwrap().len(), 3);
    let report = verify_files(std::slice::from_ref(&path)).unwrap();
    assert_eq!(report.broken, None);
    assert!(report.warnings[0].contains("line 4 is incomplete"), "{:?}", report.warnings);

    // The writer moves the torn bytes aside and continues the chain.
    let log = AuditLog::open(&path, "a").unwrap();
    log.record(minion("web4"));
    let records = read_verified(&path).unwrap();
    assert_eq!(records.len(), 5);
    assert_eq!((records[3].action.as_str(), records[3].outcome.as_str()), ("repair", "truncated"));
    let reason = records[3].reason.clone().unwrap();
    let aside = PathBuf::from(reason.rsplit("moved to ").next().unwrap());
    assert_eq!(std::fs::read(&aside).unwrap(), torn);
    assert_eq!(std::fs::metadata(&aside).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(verify_files(std::slice::from_ref(&path)).unwrap().warnings.is_empty());
}

#[test]
fn a_record_missing_only_its_newline_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    drop(write_log(&path, 2));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.pop();
    std::fs::write(&path, &bytes).unwrap();
    drop(write_log(&path, 1));
    let records = read_verified(&path).unwrap();
    assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 3]);
}

#[test]
fn long_last_lines_are_found_across_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = write_log(&path, 1);
    log.record(Record { reason: Some("x".repeat(200_000)), ..minion("big") });
    drop(log);
    drop(write_log(&path, 1));
    assert_eq!(read_verified(&path).unwrap().len(), 3);
}

#[test]
fn follower_reads_appends_across_rename_and_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = write_log(&path, 2);
    let mut follower = Follower::new(&path);
    assert_eq!(follower.poll().unwrap().lines.len(), 2);
    assert_eq!(follower.poll().unwrap().lines.len(), 0);
    log.record(minion("web3"));
    let polled = follower.poll().unwrap();
    assert_eq!(polled.lines[0].record.as_ref().unwrap().minion.as_deref(), Some("web3"));

    std::fs::rename(&path, with_suffix(&path, ".1")).unwrap();
    log.record(minion("web4"));
    let polled = follower.poll().unwrap();
    assert_eq!(polled.rotated, Some("renamed"));
    let minions: Vec<_> = polled.lines.iter().map(|l| l.record.as_ref().unwrap().minion.clone()).collect();
    assert_eq!(minions, [None, Some("web4".into())]);

    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
    log.record(minion("web5"));
    let polled = follower.poll().unwrap();
    assert_eq!(polled.rotated, Some("truncated"));
    assert_eq!(polled.lines.last().unwrap().record.as_ref().unwrap().minion.as_deref(), Some("web5"));
}

/// docs/operations.md's record fields name every action and every outcome
/// a record can have, and no other.
#[test]
fn the_docs_list_every_action_and_outcome() {
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md")).unwrap();
    let row = |field: &str| -> Vec<String> {
        let line = docs.lines().find(|l| l.starts_with(&format!("| `{field}` |"))).unwrap_or_else(|| panic!("{field}"));
        let cell = line.split('|').nth(2).unwrap();
        // The names are the code spans outside parentheses.
        let mut names = Vec::new();
        let mut depth = 0;
        let mut parts = cell.split('`');
        let mut outside = parts.next().unwrap_or("");
        loop {
            depth += outside.matches('(').count() as i32 - outside.matches(')').count() as i32;
            let Some(code) = parts.next() else { break };
            if depth == 0 {
                names.push(code.to_string());
            }
            outside = parts.next().unwrap_or("");
        }
        names
    };
    let set = |names: Vec<String>| names.into_iter().collect::<std::collections::BTreeSet<String>>();
    let actions = set(Action::ALL.iter().map(|a| a.as_str().to_string()).collect());
    assert_eq!(set(row("action")), actions, "docs/operations.md, the `action` row");
    let outcomes = set(Outcome::ALL.iter().map(|o| o.as_str().to_string()).collect());
    assert_eq!(set(row("outcome")), outcomes, "docs/operations.md, the `outcome` row");
}
