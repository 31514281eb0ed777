//! kill -9 of an agent in the middle of applying a burst of 5,000
//! decisions: after a restart it converges, and no master ever records a
//! delete or a rollback that no operator made.

use std::time::{Duration, Instant};

use keysync_tests::binary::FaultCluster;

use crate::common::{assert_no_decision, audit, converged, count, key_pool, write_pending};

const BURST: usize = 5_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_applying_a_burst_of_5000_then_restart_converges() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(16);
    let ids: Vec<String> = (0..BURST).map(|i| format!("burst{i:05}")).collect();
    let mut cluster = FaultCluster::create(root.path(), 3, |idx, f| {
        if idx == 0 {
            write_pending(&f.pki, ids.iter().cloned(), &keys);
        }
    })
    .await;
    cluster.start_all().await;

    // `salt-key -A` on master-a (Salt 3006: one rename per key).
    let pki_a = cluster.files[0].pki.clone();
    let pki_c = cluster.files[2].pki.clone();
    let renames = std::thread::spawn(move || {
        for id in &ids {
            std::fs::rename(pki_a.join("minions_pre").join(id), pki_a.join("minions").join(id)).unwrap();
        }
    });
    // master-c is killed as soon as it has applied part of the burst.
    let start = Instant::now();
    let applied_at_kill = loop {
        let n = count(&pki_c, "minions");
        if n > 0 {
            cluster.kill9(2);
            break n;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "master-c applied nothing in 60 s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    renames.join().unwrap();
    assert!(applied_at_kill < BURST, "master-c had applied the whole burst before the kill: not a mid-burst kill");
    eprintln!("master-c killed with {applied_at_kill} of {BURST} keys applied");

    cluster.start(2).await;
    converged(&cluster, Duration::from_secs(120)).await;
    for f in &cluster.files {
        assert_eq!(count(&f.pki, "minions"), BURST, "{}", f.name);
        assert_eq!(count(&f.pki, "minions_rejected"), 0, "{}", f.name);
    }
    // Nothing but accepts anywhere, and on the masters that were not killed
    // exactly one applied accept per key (no rollback re-applied).
    assert_no_decision(&cluster, &["delete", "reject"]);
    for idx in 0..2 {
        let accepts =
            audit(&cluster, idx).into_iter().filter(|r| r.action == "accept" && r.outcome == "applied").count();
        assert_eq!(accepts, BURST, "{}: one applied accept per key", cluster.files[idx].name);
    }
    cluster.stop_all();
}
