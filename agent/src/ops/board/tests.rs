//! The board: drift told once, the report's versions, link states, fetching.

use super::*;
use crate::disk::audit::read_all;
use keysync_machine::testkit::peer;

fn board(dir: &std::path::Path) -> (Board, PathBuf) {
    let text = format!(
        "node = \"master-a\"\nstate_dir = \"{d}/state\"\npki_dir = \"{d}/pki\"\n[salt]\nmaster_config = \"{d}/master\"\n[tls]\nca = \"x\"\ncert = \"x\"\nkey = \"x\"\n[[peer]]\nname = \"master-b\"\naddress = \"h:1\"\n",
        d = dir.display()
    );
    let config = crate::config::Config::parse(&text, &dir.join("config.toml")).unwrap();
    std::fs::create_dir_all(dir.join("pki")).unwrap();
    std::fs::write(dir.join("pki/master.pub"), keysync_machine::testkit::PUB).unwrap();
    let audit_path = dir.join("audit.jsonl");
    let audit = Arc::new(AuditLog::open(&audit_path, "master-a").unwrap());
    (Board::new(&config, audit, Arc::new(Metrics::new("master-a"))), audit_path)
}

fn theirs(master_pub: &str) -> MasterHealth {
    MasterHealth { master_pub: Some(master_pub.into()), ..MasterHealth::default() }
}

#[test]
fn drift_is_reported_once_per_detection_and_when_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let (board, audit_path) = board(dir.path());
    let ours = board.refresh_local(None).master_pub.unwrap();
    let outcomes = || -> Vec<String> {
        read_all(&audit_path).unwrap().into_iter().map(|r| format!("{}:{}", r.action, r.outcome)).collect()
    };

    board.peer_health(&peer("master-b"), theirs(&ours));
    assert!(outcomes().is_empty(), "agreement is not news");
    for _ in 0..5 {
        // A reconnect storm: the same report again and again.
        board.peer_health(&peer("master-b"), theirs("aa:bb"));
    }
    assert_eq!(outcomes(), ["master-key:mismatch"]);
    board.peer_health(&peer("master-b"), theirs("cc:dd"));
    assert_eq!(outcomes(), ["master-key:mismatch", "master-key:mismatch"], "another wrong key is news");
    board.peer_health(&peer("master-b"), theirs(&ours));
    board.peer_health(&peer("master-b"), theirs(&ours));
    assert_eq!(outcomes(), ["master-key:mismatch", "master-key:mismatch", "master-key:resolved"]);

    let report = board.report_with(KeyCounts::default());
    assert!(!report.peers[0].drift.master_pub_mismatch);
    assert!(board.metrics().encode().contains("keysync_master_key_mismatch{peer=\"master-b\"} 0"));
}

#[test]
fn the_report_names_this_agents_version_and_protocol_and_a_peer_of_another_version() {
    let dir = tempfile::tempdir().unwrap();
    let (board, _) = board(dir.path());
    let ours = board.refresh_local(None);
    assert_eq!(ours.agent_version.as_deref(), Some(env!("CARGO_PKG_VERSION")), "sent in every Hello");
    let report = board.report_with(KeyCounts::default());
    assert_eq!(report.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(report.protocol_version, Some(keysync_proto::PROTOCOL_VERSION));
    assert!(report.findings.is_empty(), "a peer that has not reported is no other version: {:?}", report.findings);
    // A peer's Hello without a version: an agent of 0.1.0.
    board.peer_health(&peer("master-b"), theirs(ours.master_pub.as_deref().unwrap()));
    let report = board.report_with(KeyCounts::default());
    let mixed: Vec<&Finding> = report.findings.iter().filter(|f| f.kind == "agent-version").collect();
    assert_eq!(mixed.len(), 1, "{:?}", report.findings);
    assert!(
        mixed[0].message.contains(&format!("0.1.0 on master-b; {} on master-a", env!("CARGO_PKG_VERSION"))),
        "{mixed:?}"
    );
    board.peer_health(
        &peer("master-b"),
        MasterHealth { agent_version: ours.agent_version.clone(), ..theirs(ours.master_pub.as_deref().unwrap()) },
    );
    assert!(board.report_with(KeyCounts::default()).findings.is_empty(), "the upgrade has ended");
}

#[test]
fn link_state_keeps_the_last_error_until_up() {
    let dir = tempfile::tempdir().unwrap();
    let (board, _) = board(dir.path());
    let state = |board: &Board| board.report_with(KeyCounts::default()).peers[0].clone();
    assert_eq!(state(&board).state, LinkState::Connecting);
    board.set_state(&peer("master-b"), LinkState::Down, Some("connection refused".into()));
    assert_eq!(state(&board).last_error.as_deref(), Some("connection refused"));
    assert!(board.metrics().encode().contains("keysync_peer_up{peer=\"master-b\"} 0"));
    board.set_state(&peer("master-b"), LinkState::Up, None);
    assert_eq!((state(&board).state, state(&board).last_error), (LinkState::Up, None));
    assert!(board.metrics().encode().contains("keysync_peer_up{peer=\"master-b\"} 1"));
    board.contact(&peer("nobody"));
    assert!(state(&board).last_contact.is_none(), "unknown peers are ignored");
}

#[test]
fn a_peer_is_fetching_for_a_while_after_its_last_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let (board, _) = board(dir.path());
    let t0 = std::time::Instant::now();
    assert!(!board.peer_fetching_at(&peer("master-b"), t0), "a peer that never fetched is not fetching");
    board.peer_fetched_at(&peer("master-b"), t0);
    assert!(board.peer_fetching_at(&peer("master-b"), t0 + FETCHING / 2));
    assert!(!board.peer_fetching_at(&peer("master-b"), t0 + FETCHING), "a round quiet for FETCHING is over");
    board.peer_fetched_at(&peer("master-b"), t0 + FETCHING);
    assert!(board.peer_fetching_at(&peer("master-b"), t0 + FETCHING + FETCHING / 2), "each fetch extends it");
    board.peer_fetched_at(&peer("nobody"), t0);
    assert!(!board.peer_fetching_at(&peer("nobody"), t0), "unknown peers are ignored");
}
