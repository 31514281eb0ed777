//! Clocks hours apart: master-a 90 minutes ahead and master-c 90 minutes
//! behind (within a 4 h `max_clock_skew`) still converge, and a decision
//! made later on the slow master still wins. Then master-c restarted 10 h
//! ahead: its decisions are refused by the others and audited once each,
//! instead of winning every conflict. Clocks are shifted per process with the
//! test-only knob `SALT_KEYSYNC_FAULT_CLOCK_OFFSET_MS` (see agent/src/fault.rs).

use std::time::Duration;

use keysync_tests::binary::{run_cli, FaultCluster};
use keysync_tests::salt_ops::{delete_key, move_key, SaltLine};
use keysync_tests::wait_until;
use salt_keysync::ops::findings::Level;

use crate::common::{
    add_timing, assert_winners_applied, audit, converged, decided, key_pool, version_key, write_pending,
};

const OFFSET: &str = "SALT_KEYSYNC_FAULT_CLOCK_OFFSET_MS";
const MINUTE_MS: i64 = 60_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_clocks_converge_and_a_peer_far_in_the_future_is_refused() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(10);
    let ids: Vec<String> = (0..10).map(|i| format!("clock{i}")).collect();
    let mut cluster = FaultCluster::create(root.path(), 3, |_, f| {
        write_pending(&f.pki, ids.iter().cloned(), &keys);
        add_timing(&f.config_path, "max_clock_skew = \"4h\"");
    })
    .await;
    cluster.env[0] = vec![(OFFSET.into(), (90 * MINUTE_MS).to_string())];
    cluster.env[2] = vec![(OFFSET.into(), (-90 * MINUTE_MS).to_string())];
    cluster.start_all().await;
    for idx in [0, 2] {
        let log = std::fs::read_to_string(cluster.log(idx)).unwrap();
        assert!(
            log.contains("test-only fault injection active"),
            "the agent binary lacks the fault-injection feature: run `cargo test --workspace` (or \
             `cargo build -p salt-keysync --features fault-injection`) before this test"
        );
    }
    let pki: Vec<_> = cluster.files.iter().map(|f| f.pki.clone()).collect();

    // The fast master accepts; later the slow master rejects: the later one wins.
    move_key(SaltLine::S3008, &pki[0], "clock0", "minions");
    move_key(SaltLine::S3006, &pki[0], "clock1", "minions");
    wait_until(Duration::from_secs(30), "the accepts reach the slow master", || {
        decided(&pki[2]).get("clock0").is_some_and(|(folder, _)| *folder == "minions")
    })
    .await;
    move_key(SaltLine::S3008, &pki[2], "clock0", "minions_rejected");
    move_key(SaltLine::S3006, &pki[2], "clock2", "minions_rejected");
    move_key(SaltLine::S3006, &pki[1], "clock3", "minions");
    wait_until(Duration::from_secs(30), "the slow master's reject reaches the fast one", || {
        decided(&pki[0]).contains_key("clock2")
    })
    .await;
    delete_key(&pki[0], "clock2");
    converged(&cluster, Duration::from_secs(30)).await;
    for (idx, pki) in pki.iter().enumerate() {
        assert_winners_applied(&cluster, idx);
        let state = decided(pki);
        assert_eq!(state.get("clock0").map(|s| s.0), Some("minions_rejected"), "the later reject wins");
        assert_eq!(state.get("clock2"), None, "the later delete wins");
    }

    // master-c jumps 10 h ahead: far beyond the 4 h bound.
    cluster.stop(2);
    cluster.env[2] = vec![(OFFSET.into(), (600 * MINUTE_MS).to_string())];
    cluster.start(2).await;
    move_key(SaltLine::S3006, &pki[2], "clock1", "minions_rejected");
    let refusals = |idx: usize| {
        audit(&cluster, idx)
            .into_iter()
            .filter(|r| r.action == "refuse" && r.minion.as_deref() == Some("clock1"))
            .collect::<Vec<_>>()
    };
    for idx in 0..2 {
        wait_until(Duration::from_secs(30), "the future decision is refused and audited", || !refusals(idx).is_empty())
            .await;
    }
    // Anti-entropy (every second) offers it again and again: still one record.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (idx, pki) in pki.iter().enumerate().take(2) {
        let refused = refusals(idx);
        assert_eq!(refused.len(), 1, "{}: {refused:?}", cluster.files[idx].name);
        assert!(refused[0].reason.as_deref().unwrap_or("").contains("ahead of this node's clock"), "{refused:?}");
        assert_eq!(decided(pki).get("clock1").map(|s| s.0), Some("minions"), "the future reject did not win");
    }
    cluster.stop_all();
}

/// Issue 28 item 4: master-a's clock runs 12 s ahead (`max_clock_skew` 5 s),
/// so its peers refuse its decisions until their clocks catch up. It
/// rejects a key, which its peers take once their clocks are within 5 s of
/// the stamp, then accepts it again and is stopped while they still refuse
/// that. The documented fix follows (time synchronised, `recover
/// --from-peers --force`): the recovered store journals the reject, which
/// the folders, showing the accept, overtook; the key is a claim of this
/// master's, and the peers offer the reject. It is its own forgotten past:
/// taken back, and the key shows rejected on it as on the others (before:
/// `refuse … claims this master as its origin, which never made it` at
/// every round, the key accepted on that master only, and the hostile-peer
/// alert). Then a purge and reinstall: the same, for each of its decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_started_afresh_takes_back_what_it_decided_before() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(2);
    let (flipped, kept) = ("ahead-flipped".to_string(), "ahead-kept".to_string());
    let ids = [flipped.clone(), kept.clone()];
    let mut cluster = FaultCluster::create(root.path(), 3, |_, f| {
        write_pending(&f.pki, ids.iter().cloned(), &keys);
        add_timing(&f.config_path, "max_clock_skew = \"5s\"");
    })
    .await;
    cluster.env[0] = vec![(OFFSET.into(), (12_000).to_string())];
    cluster.start_all().await;
    let pki: Vec<_> = cluster.files.iter().map(|f| f.pki.clone()).collect();
    let shows = |idx: usize, id: &str| decided(&pki[idx]).get(id).map(|s| s.0);

    // Told by `status` on both sides, before any decision: master-a's
    // decisions are refused by its peers, which refuse master-a's.
    let on_a = status_until(&cluster, 0, "master-a says its peers refuse its decisions", |findings| {
        findings.iter().any(|f| f.kind == "clock" && f.masters == ["master-a", "master-b", "master-c"])
    })
    .await;
    let finding = on_a.findings.iter().find(|f| f.kind == "clock").unwrap();
    assert_eq!(finding.level, Level::Error);
    assert!(
        finding
            .message
            .starts_with("this master's decisions are refused by master-b, master-c: it stamps them up to 1")
            && finding.message.contains("past their max_clock_skew (5s)")
            && finding.message.contains("this master's wall clock reads 1"),
        "{finding:?}"
    );
    let clock = on_a.peers.iter().find(|p| p.name == "master-b").and_then(|p| p.clock.clone()).unwrap();
    assert!(clock.refuses_ours && !clock.refused_here && clock.offset_ms < -10_000, "{clock:?}");
    for idx in 1..3 {
        let on_peer = status_until(&cluster, idx, "the peers say they refuse master-a's decisions", |findings| {
            findings.iter().any(|f| f.kind == "clock" && f.masters == ["master-a"])
        })
        .await;
        let finding = on_peer.findings.iter().find(|f| f.kind == "clock").unwrap();
        assert_eq!(finding.level, Level::Error);
        assert!(finding.message.starts_with("master-a's decisions are refused here: it stamps them 1"), "{finding:?}");
    }

    move_key(SaltLine::S3006, &pki[0], &kept, "minions");
    move_key(SaltLine::S3006, &pki[0], &flipped, "minions_rejected");
    for idx in 1..3 {
        wait_until(Duration::from_secs(60), "the peers apply master-a's decisions once their clocks catch up", || {
            shows(idx, &kept) == Some("minions") && shows(idx, &flipped) == Some("minions_rejected")
        })
        .await;
    }
    let refusals = |idx: usize, id: &str| {
        audit(&cluster, idx)
            .into_iter()
            .filter(|r| {
                r.action == "refuse"
                    && r.minion.as_deref() == Some(id)
                    && r.reason.as_deref().unwrap_or("").contains("ahead of this node's clock")
            })
            .count()
    };
    assert!((1..3).all(|idx| refusals(idx, &kept) == 1 && refusals(idx, &flipped) == 1));
    move_key(SaltLine::S3006, &pki[0], &flipped, "minions");
    wait_until(Duration::from_secs(30), "master-b refuses the accept", || refusals(1, &flipped) == 2).await;

    // The documented fix: time synchronised, the store rebuilt from the peers.
    cluster.stop(0);
    cluster.env[0] = Vec::new();
    let config = cluster.files[0].config_path.to_str().unwrap().to_string();
    let recovered = run_cli(&["recover", "--from-peers", "--force", "--config", &config]);
    assert!(recovered.status.success(), "{recovered:?}");
    cluster.start(0).await;
    let own_past = |cluster: &FaultCluster| {
        let records = audit(cluster, 0);
        let start = records.iter().rposition(|r| r.action == "start").unwrap_or(0);
        records[start..]
            .iter()
            .filter(|r| {
                r.reason.as_deref().is_some_and(|reason| {
                    reason.contains("claims this master") || reason.contains("before its store started afresh")
                })
            })
            .cloned()
            .collect::<Vec<_>>()
    };
    wait_until(Duration::from_secs(30), "master-a hears of its reject from before the recovery", || {
        !own_past(&cluster).is_empty()
    })
    .await;
    let told = own_past(&cluster);
    assert!(
        told.iter().all(|r| r.action == "take-back" && r.outcome == "taken-back"),
        "refused instead of taken back: {told:#?}"
    );
    converged(&cluster, Duration::from_secs(30)).await;
    assert_eq!(shows(0, &flipped), Some("minions_rejected"), "the accept made while ahead is to be made again");
    // Time synchronised: no finding about clocks on any master.
    for idx in 0..3 {
        status_until(&cluster, idx, "the clocks agree", |findings| findings.iter().all(|f| f.kind != "clock")).await;
    }
    assert_eq!(shows(0, &kept), Some("minions"));

    // A purge and reinstall: no store, no marker; the folders as they were.
    // Its new store starts afresh when it is made: after what master-a
    // stamped ahead, once real time has passed that (docs/recovery.md).
    let stamped_ms = audit(&cluster, 1)
        .iter()
        .filter_map(|r| r.version.as_deref().filter(|v| v.ends_with("@master-a")).map(|v| version_key(v).0))
        .max()
        .unwrap();
    wait_until(Duration::from_secs(30), "real time passes what master-a stamped ahead", || {
        salt_keysync::node::wall_ms() > stamped_ms
    })
    .await;
    cluster.stop(0);
    std::fs::remove_dir_all(cluster.files[0].dir.join("state")).unwrap();
    std::fs::remove_file(pki[0].join(".keysync-staging/.salt-keysync-state")).unwrap();
    cluster.start(0).await;
    let n_taken = |cluster: &FaultCluster| -> usize {
        own_past(cluster).iter().filter(|r| r.action == "take-back").map(|r| count_in(r.reason.as_deref())).sum()
    };
    wait_until(Duration::from_secs(30), "master-a hears of both its decisions made before the reinstall", || {
        own_past(&cluster).len() > 1 || n_taken(&cluster) >= 2
    })
    .await;
    converged(&cluster, Duration::from_secs(30)).await;
    let told = own_past(&cluster);
    assert!(
        told.iter().all(|r| r.action == "take-back" && r.outcome == "taken-back"),
        "refused instead of taken back: {told:#?}"
    );
    assert_eq!(n_taken(&cluster), 2, "{told:#?}");
    assert_eq!((shows(0, &flipped), shows(0, &kept)), (Some("minions_rejected"), Some("minions")));
    cluster.stop_all();
}

/// The count a take-back record's reason begins with.
fn count_in(reason: Option<&str>) -> usize {
    reason.and_then(|r| r.split(' ').next()?.parse().ok()).unwrap_or(0)
}

/// `status --json` of agent `idx` once its findings satisfy `check`
/// (polled for up to 30 s; a failure shows the last findings).
async fn status_until(
    cluster: &FaultCluster,
    idx: usize,
    what: &str,
    check: impl Fn(&[salt_keysync::ops::findings::Finding]) -> bool,
) -> salt_keysync::ops::board::StatusReport {
    let config = cluster.files[idx].config_path.to_str().unwrap().to_string();
    let start = std::time::Instant::now();
    loop {
        let out = run_cli(&["status", "--json", "--config", &config]);
        let last = match serde_json::from_slice::<salt_keysync::ops::board::StatusReport>(&out.stdout) {
            Ok(report) if check(&report.findings) => return report,
            Ok(report) => format!("{:#?}", report.findings),
            Err(e) => format!("{e}: {}", String::from_utf8_lossy(&out.stderr)),
        };
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}: not true after 30 s: {what}; last: {last}",
            cluster.files[idx].name
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
