//! Clocks hours apart: master-a 90 minutes ahead and master-c 90 minutes
//! behind (within a 4 h `max_clock_skew`) still converge, and a decision
//! made later on the slow master still wins. Then master-c restarted 10 h
//! ahead: its decisions are refused by the others and audited once each,
//! instead of winning every conflict. Clocks are shifted per process with the
//! test-only knob `SALT_KEYSYNC_FAULT_CLOCK_OFFSET_MS` (see agent/src/fault.rs).

use std::time::Duration;

use keysync_tests::binary::FaultCluster;
use keysync_tests::salt_ops::{delete_key, move_key, SaltLine};
use keysync_tests::wait_until;

use crate::common::{add_timing, assert_winners_applied, audit, converged, decided, key_pool, write_pending};

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
