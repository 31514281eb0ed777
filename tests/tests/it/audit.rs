//! `salt-keysync audit` as a black box: filters alone and combined, the
//! table, `verify` exit statuses on tampered and rotated logs, `--follow`
//! across rotation, and the agent's JSON log format.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use keysync_server::CertAuthority;
use keysync_tests::binary::{binary, free_addr, run_cli, AgentProcess};
use keysync_tests::cluster::write_agent_files;
use salt_keysync::disk::audit::{line_hash, AuditLog, Record, GENESIS};
use salt_keysync::disk::audit::{Action, Outcome, Via};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Writes `records` as a correctly chained log (times chosen by the test).
fn write_chain(path: &Path, records: Vec<Record>) {
    let mut prev = GENESIS.to_string();
    let mut text = String::new();
    for (idx, mut record) in records.into_iter().enumerate() {
        record.seq = idx as u64 + 1;
        record.prev = prev;
        let line = serde_json::to_string(&record).unwrap();
        prev = line_hash(line.as_bytes());
        text.push_str(&line);
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap()
}

fn rec(ago_min: i64, action: Action, minion: Option<&str>, origin: Option<&str>, via: Via<'_>) -> Record {
    Record {
        time: rfc3339(OffsetDateTime::now_utc() - time::Duration::minutes(ago_min)),
        node: "master-a".into(),
        minion: minion.map(str::to_string),
        origin: origin.map(str::to_string),
        fingerprint: minion.map(|_| "ab:cd:ef:01:23:45:67:89:ab:cd:ef:01:23:45:67:89".into()),
        ..Record::new(action, via, Outcome::Applied)
    }
}

fn peer(name: &str) -> keysync_server::PeerName {
    keysync_server::PeerName::new(name).unwrap()
}

/// Seven records over the last three hours.
fn sample_log(dir: &Path) -> PathBuf {
    let path = dir.join("audit.jsonl");
    let (master_b, master_c) = (peer("master-b"), peer("master-c"));
    write_chain(
        &path,
        vec![
            rec(180, Action::Accept, Some("web01"), Some("master-a"), Via::Local),
            rec(150, Action::Reject, Some("web02"), Some("master-b"), Via::Peer(&master_b)),
            rec(90, Action::Accept, Some("db01"), Some("master-b"), Via::Peer(&master_c)),
            rec(60, Action::Conflict, Some("web01"), Some("master-c"), Via::Peer(&master_b)),
            rec(20, Action::Delete, Some("web01"), Some("master-a"), Via::Local),
            rec(5, Action::Refuse, None, None, Via::Network),
            rec(1, Action::Pending, Some("web03"), Some("master-a"), Via::Local),
        ],
    );
    path
}

/// The `seq`s `audit --json ARGS` prints.
fn seqs(path: &Path, args: &[&str]) -> Vec<u64> {
    let mut all = vec!["audit", "--file", path.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    let out = run_cli(&all);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Record>(line).unwrap().seq)
        .collect()
}

#[test]
fn each_filter_alone_and_combined() {
    let dir = tempfile::tempdir().unwrap();
    let log = sample_log(dir.path());
    let at_30m_ago = rfc3339(OffsetDateTime::now_utc() - time::Duration::minutes(30));
    let cases: &[(&[&str], &[u64])] = &[
        (&[], &[1, 2, 3, 4, 5, 6, 7]),
        (&["--minion", "web*"], &[1, 2, 4, 5, 7]),
        (&["--minion", "web0[2-3]"], &[2, 7]),
        (&["--action", "accept"], &[1, 3]),
        (&["--action", "reject,delete"], &[2, 5]),
        (&["--action", "refuse", "--action", "pending"], &[6, 7]),
        (&["--origin", "master-b"], &[2, 3]),
        (&["--since", "2h"], &[3, 4, 5, 6, 7]),
        (&["--since", "30m"], &[5, 6, 7]),
        (&["--until", "2h"], &[1, 2]),
        (&["--until", &at_30m_ago], &[1, 2, 3, 4]),
        (&["--minion", "web*", "--action", "accept,delete", "--since", "4h", "--until", "10m"], &[1, 5]),
        (&["--origin", "master-a", "--since", "30m"], &[5, 7]),
        (&["--minion", "db*", "--origin", "master-a"], &[]),
    ];
    for (args, expected) in cases {
        assert_eq!(seqs(&log, args), *expected, "audit {args:?}");
    }

    let bad = run_cli(&["audit", "--file", log.to_str().unwrap(), "--since", "yesterday"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--since: \"yesterday\" is neither"));
}

#[test]
fn the_default_output_is_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let log = sample_log(dir.path());
    let out = run_cli(&["audit", "--file", log.to_str().unwrap(), "--action", "reject"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for header in ["TIME", "NODE", "ACTION", "OUTCOME", "MINION", "ORIGIN", "VIA", "FINGERPRINT"] {
        assert!(lines[0].contains(header), "{text}");
    }
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(&cells[2..8], ["master-a", "reject", "applied", "web02", "master-b", "master-b"], "{text}");
    assert!(cells[8].starts_with("ab:cd:ef:01:23:45:67:89…"), "{text}");
}

/// Issue 14 item 6: a valid Salt id holding a newline and `ESC[8m` (and a
/// peer name with a bidirectional override) cannot forge a row of the table
/// or hide the real one: `audit` never prints a raw control character, and
/// each record stays one row; `--json` keeps the text as it was.
#[test]
fn the_table_never_prints_a_control_character() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let forged_id = "web01\n2026-01-01 00:00:00Z  master-a  accept  applied  evil\u{1b}[8m";
    let mut hostile = rec(2, Action::Refuse, Some(forged_id), Some("master-b\u{202e}"), Via::Network);
    hostile.reason = Some("bad\rkey\u{7}".into());
    write_chain(&path, vec![rec(3, Action::Accept, Some("web02"), Some("master-a"), Via::Local), hostile]);
    let out = run_cli(&["audit", "--file", path.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
    assert!(!text.contains('\u{202e}'), "{text:?}");
    assert_eq!(text.lines().count(), 3, "a header and one row per record: {text}");
    assert!(text.contains("web01\\u{a}2026-01-01") && text.contains("evil\\u{1b}[8m"), "{text}");
    let json = run_cli(&["audit", "--file", path.to_str().unwrap(), "--json"]);
    let records: Vec<Record> =
        String::from_utf8(json.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records[1].minion.as_deref(), Some(forged_id), "JSON keeps the id as it is");
}

/// `audit verify FILES` → (exit code, stdout).
fn verify(files: &[&Path]) -> (i32, String) {
    let mut args = vec!["audit", "verify"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let out = run_cli(&args);
    (out.status.code().unwrap(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn verify_names_an_edited_a_deleted_and_a_reordered_record() {
    let dir = tempfile::tempdir().unwrap();
    let log = sample_log(dir.path());
    let (code, text) = verify(&[&log]);
    assert_eq!((code, text.trim()), (0, format!("ok: 7 records in {}, chain intact", log.display()).as_str()));
    let original: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(str::to_string).collect();
    let tamper = |change: &dyn Fn(&mut Vec<String>)| {
        let mut lines = original.clone();
        change(&mut lines);
        std::fs::write(&log, lines.join("\n") + "\n").unwrap();
        verify(&[&log])
    };

    let (code, text) = tamper(&|l| l[2] = l[2].replace("db01", "db99"));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("line 3: this record was edited"), "{text}");

    let (code, text) = tamper(&|l| {
        l.remove(3);
    });
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("line 4: records seq 4 is missing before this line: removed"), "{text}");

    let (code, text) = tamper(&|l| l.swap(4, 5));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("line 5: records out of order: seq 6 comes before seq 5"), "{text}");

    let (code, _) = verify(&[&dir.path().join("missing.jsonl")]);
    assert_eq!(code, 2);
}

#[test]
fn verify_follows_the_chain_across_rotated_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let rotated = dir.path().join("audit.jsonl.1");
    let log = AuditLog::open(&path, "master-a").unwrap();
    log.record(Record::new(Action::Start, Via::Local, Outcome::Started));
    std::fs::rename(&path, &rotated).unwrap();
    log.record(Record::new(Action::Stop, Via::Local, Outcome::Stopped));

    let (code, text) = verify(&[&rotated, &path]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("ok: 3 records"), "{text}");
    let (code, text) = verify(&[&path]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("continues from a rotated file"), "{text}");
    let (code, text) = verify(&[&path, &rotated]);
    assert_eq!(code, 1, "{text}");
    // Listing reads rotated files in the order given.
    let out = run_cli(&["audit", "--json", "--file", rotated.to_str().unwrap(), "--file", path.to_str().unwrap()]);
    let seqs: Vec<u64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Record>(line).unwrap().seq)
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
}

#[test]
fn follow_prints_records_appended_later_also_after_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path, "master-a").unwrap();
    log.record(Record { minion: Some("early".into()), ..Record::new(Action::Accept, Via::Local, Outcome::Applied) });
    let mut child = KillOnDrop(
        Command::new(binary())
            .args(["audit", "--follow", "--json", "--minion", "late*", "--file"])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(serde_json::from_str::<Record>(&line).unwrap()).is_err() {
                break;
            }
        }
    });
    let next = || rx.recv_timeout(Duration::from_secs(20)).expect("audit --follow printed nothing within 20 s");

    log.record(Record { minion: Some("late1".into()), ..Record::new(Action::Reject, Via::Local, Outcome::Applied) });
    assert_eq!(next().minion.as_deref(), Some("late1"));
    std::fs::rename(&path, dir.path().join("audit.jsonl.1")).unwrap();
    log.record(Record { minion: Some("late2".into()), ..Record::new(Action::Delete, Via::Local, Outcome::Applied) });
    assert_eq!(next().minion.as_deref(), Some("late2"));
    // logrotate copytruncate of the new file
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
    log.record(Record { minion: Some("late3".into()), ..Record::new(Action::Accept, Via::Local, Outcome::Applied) });
    assert_eq!(next().minion.as_deref(), Some("late3"));
}

/// A child process ended when the test ends, also when it fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs one agent (no peers) until it logged its start, stops it, and returns
/// its stderr and its audit log path.
/// One start and stop of an agent; `journal`: its output stream is the one
/// JOURNAL_STREAM names, as under systemd.
fn run_agent_once(log_format: Option<&str>, journal: bool) -> (String, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("ca").unwrap();
    let files = write_agent_files(dir.path(), &ca, "master-a", free_addr(), &[]);
    if let Some(format) = log_format {
        let config = std::fs::read_to_string(&files.config_path).unwrap();
        std::fs::write(&files.config_path, format!("log_format = \"{format}\"\n{config}")).unwrap();
    }
    let log_path = dir.path().join("agent.log");
    // The log file keeps its inode: the agent is started on it truncated.
    let stream = {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::File::create(&log_path).unwrap().metadata().unwrap();
        format!("{}:{}", meta.dev(), meta.ino())
    };
    let env: &[(&str, &str)] = if journal { &[("JOURNAL_STREAM", &stream)] } else { &[] };
    let agent = AgentProcess::start_with_env(&files.config_path, log_path.clone(), env);
    let started = (0..400).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        std::fs::read_to_string(&log_path).is_ok_and(|t| t.contains("agent started"))
    });
    let status = agent.stop();
    let text = std::fs::read_to_string(&log_path).unwrap();
    assert!(started && status.success(), "{status}: {text}");
    (text, files.audit_log, dir)
}

#[test]
fn the_agent_logs_json_when_configured() {
    let (text, audit_log, _dir) = run_agent_once(Some("json"), false);
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(value["level"].is_string() && value["fields"]["message"].is_string(), "{line}");
    }
    assert!(text.lines().any(|l| l.contains("\"message\":\"agent started\"") && l.contains("\"node\":\"master-a\"")));
    // The agent's own audit log verifies and records what the first start
    // found (one inventory record), the start and the stop.
    let (code, out) = verify(&[&audit_log]);
    assert_eq!(code, 0, "{out}");
    let actions: Vec<String> =
        salt_keysync::disk::audit::read_all(&audit_log).unwrap().into_iter().map(|r| r.action).collect();
    assert_eq!(actions, ["inventory", "start", "stop"]);
}

#[test]
fn the_agent_logs_plain_text_for_journald_by_default() {
    // Under systemd (JOURNAL_STREAM names the output stream): no timestamp,
    // no colours, a syslog priority journald turns into the entry's PRIORITY.
    let (text, _, _dir) = run_agent_once(None, true);
    let started = text.lines().find(|l| l.contains("agent started")).unwrap_or_else(|| panic!("{text}"));
    assert!(started.starts_with("<6> INFO "), "{started}");
    assert!(started.contains("node=master-a"), "{started}");
    assert!(text.lines().all(|l| l.starts_with('<')), "{text}");
    // Elsewhere (a file here): timestamps, and still no colour codes off a terminal.
    let (text, _, _dir) = run_agent_once(Some("text"), false);
    let started = text.lines().find(|l| l.contains("agent started")).unwrap_or_else(|| panic!("{text}"));
    assert!(started.starts_with("20") && started.contains(" INFO "), "{started}");
    assert!(!text.contains('\x1b'), "{text}");
}

/// Issue 8: every local decision, pending key and applied peer decision is
/// recorded; a pending key that arrived while the agent was stopped too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_record_decisions_pending_keys_and_peer_decisions() {
    use keysync_tests::cluster::TestCluster;
    use keysync_tests::salt_ops::{master_writes_pending, move_key, new_public_key, SaltLine};
    let mut cluster = TestCluster::start(2).await;
    cluster.stop(1).await;
    let (offline, live) = (new_public_key(), new_public_key());
    master_writes_pending(cluster.pki(1), "arrived-offline", &offline);
    cluster.restart(1).await;
    let has = |records: &[Record], action: &str, minion: &str, via: &str| {
        records.iter().any(|r| r.action == action && r.minion.as_deref() == Some(minion) && r.via == via)
    };
    master_writes_pending(cluster.pki(0), "web01", &live);
    keysync_tests::wait_until(Duration::from_secs(20), "the pending key is audited", || {
        has(&cluster.agents[0].audit(), "pending", "web01", "local")
    })
    .await;
    move_key(SaltLine::S3008, cluster.pki(0), "web01", "minions");
    keysync_tests::wait_until(Duration::from_secs(20), "both agents audited the accept", || {
        has(&cluster.agents[0].audit(), "accept", "web01", "local")
            && has(&cluster.agents[1].audit(), "accept", "web01", "master-a")
    })
    .await;
    let a = cluster.agents[0].audit();
    let b = cluster.agents[1].audit();
    assert!(has(&b, "pending", "arrived-offline", "local"), "{b:#?}");
    let applied = b.iter().find(|r| r.action == "accept").unwrap();
    assert_eq!((applied.origin.as_deref(), applied.outcome.as_str()), (Some("master-a"), "applied"));
    assert_eq!(applied.fingerprint, a.iter().find(|r| r.action == "accept").unwrap().fingerprint);
    for agent in &cluster.agents {
        let (code, out) = verify(&[&agent.files.audit_log]);
        assert_eq!(code, 0, "{out}");
    }
    cluster.shutdown().await;
}

/// A killed agent, and a torn last line (what a power cut can leave), keep a
/// verifiable chain: the next start sets the torn bytes aside and records it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_survives_kill_9_and_a_torn_line() {
    use keysync_tests::binary::AgentProcess;
    use keysync_tests::salt_ops::{master_writes_pending, new_public_key};
    let dir = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("ca").unwrap();
    let files = write_agent_files(dir.path(), &ca, "master-a", free_addr(), &[]);
    let started = |log: &Path| std::fs::read_to_string(log).is_ok_and(|t| t.contains("agent started"));
    let first_log = dir.path().join("first.log");
    let agent = AgentProcess::start(&files.config_path, first_log.clone());
    keysync_tests::wait_until(Duration::from_secs(20), "agent started", || started(&first_log)).await;
    master_writes_pending(&files.pki, "web01", &new_public_key());
    keysync_tests::wait_until(Duration::from_secs(20), "pending key audited", || {
        salt_keysync::disk::audit::read_all(&files.audit_log).unwrap().iter().any(|r| r.action == "pending")
    })
    .await;
    drop(agent); // SIGKILL

    let torn = br#"{"time":"2026-11-21T10:00:00Z","node":"master-a","action":"acc"#;
    let mut bytes = std::fs::read(&files.audit_log).unwrap();
    bytes.extend_from_slice(torn);
    std::fs::write(&files.audit_log, bytes).unwrap();
    let (code, out) = verify(&[&files.audit_log]);
    assert_eq!(code, 0, "a torn last line is a warning, not a broken chain: {out}");

    let second_log = dir.path().join("second.log");
    let agent = AgentProcess::start(&files.config_path, second_log.clone());
    keysync_tests::wait_until(Duration::from_secs(20), "agent restarted", || started(&second_log)).await;
    assert!(agent.stop().success());
    let (code, out) = verify(&[&files.audit_log]);
    assert_eq!(code, 0, "{out}");
    let records = salt_keysync::disk::audit::read_all(&files.audit_log).unwrap();
    let actions: Vec<&str> = records.iter().map(|r| r.action.as_str()).collect();
    // No stop after the kill; the repair comes first after the restart.
    assert_eq!(actions[..4], ["inventory", "start", "pending", "repair"], "{actions:?}");
    assert!(actions[4..].contains(&"start") && actions.last() == Some(&"stop"), "{actions:?}");
    let aside = std::fs::read_dir(files.audit_log.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains(".torn-"))
        .expect("the torn bytes were kept");
    assert_eq!(std::fs::read(aside).unwrap(), torn);
}

/// Issue 14 item 7: records cut off the end of the log while the agent is
/// stopped leave a chain that verifies, but the next start notices (the
/// store noted where the chain ended) and records a `gap` naming the head
/// it had written; `audit verify --head` with that head fails on the cut log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_tail_is_noticed_at_the_next_start() {
    use keysync_tests::binary::AgentProcess;
    use keysync_tests::salt_ops::{master_writes_pending, new_public_key};
    let dir = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("ca").unwrap();
    let files = write_agent_files(dir.path(), &ca, "master-a", free_addr(), &[]);
    let started = |log: &Path| std::fs::read_to_string(log).is_ok_and(|t| t.contains("agent started"));
    let first_log = dir.path().join("first.log");
    let agent = AgentProcess::start(&files.config_path, first_log.clone());
    keysync_tests::wait_until(Duration::from_secs(20), "agent started", || started(&first_log)).await;
    for id in ["web01", "web02", "web03"] {
        master_writes_pending(&files.pki, id, &new_public_key());
    }
    keysync_tests::wait_until(Duration::from_secs(20), "pending keys audited", || {
        salt_keysync::disk::audit::read_all(&files.audit_log).unwrap().iter().filter(|r| r.action == "pending").count()
            == 3
    })
    .await;
    assert!(agent.stop().success());
    let text = std::fs::read_to_string(&files.audit_log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let last: Record = serde_json::from_str(lines.last().unwrap()).unwrap();
    let head = format!("{}:{}", last.seq, line_hash(lines.last().unwrap().as_bytes()));
    // Someone removes the last three records: the rest still verifies.
    let cut: String = lines[..lines.len() - 3].iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&files.audit_log, cut).unwrap();
    let (code, out) = verify(&[&files.audit_log]);
    assert_eq!(code, 0, "a cut tail alone verifies: {out}");
    let told = run_cli(&["audit", "verify", files.audit_log.to_str().unwrap(), "--head", &head]);
    assert_eq!(told.status.code(), Some(1), "{}", String::from_utf8_lossy(&told.stdout));
    assert!(String::from_utf8_lossy(&told.stdout).contains("cut off the end"));

    let second_log = dir.path().join("second.log");
    let agent = AgentProcess::start(&files.config_path, second_log.clone());
    keysync_tests::wait_until(Duration::from_secs(20), "agent restarted", || started(&second_log)).await;
    assert!(agent.stop().success());
    let records = salt_keysync::disk::audit::read_all(&files.audit_log).unwrap();
    let gap = records.iter().find(|r| r.action == "gap").expect("a gap record");
    assert_eq!(gap.outcome, "detected");
    assert!(gap.reason.as_deref().is_some_and(|why| why.contains(&head) && why.contains("removed")), "{gap:#?}");
    let log = std::fs::read_to_string(&second_log).unwrap();
    assert!(log.contains("ERROR") && log.contains("tampered"), "{log}");
    // A whole log with its head: verify --head passes.
    let records_text = std::fs::read_to_string(&files.audit_log).unwrap();
    let final_line = records_text.lines().last().unwrap();
    let final_seq = serde_json::from_str::<Record>(final_line).unwrap().seq;
    let whole = run_cli(&[
        "audit",
        "verify",
        files.audit_log.to_str().unwrap(),
        "--head",
        &format!("{final_seq}:{}", line_hash(final_line.as_bytes())),
    ]);
    assert_eq!(whole.status.code(), Some(0), "{}", String::from_utf8_lossy(&whole.stdout));
}
