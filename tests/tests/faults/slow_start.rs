//! A master whose start takes long (the store read and the folders
//! reconciled: tens of seconds at 1,000,000 keys) answers its peers' TLS
//! handshakes meanwhile: a peer connecting then waits for its answer, it
//! never times out. The test-only knob `SALT_KEYSYNC_FAULT_START_DELAY_MS`
//! (see agent/src/fault.rs) makes the start that slow without the keys.

use std::time::{Duration, Instant};

use keysync_tests::binary::FaultCluster;

use crate::common::{converged, count, key_pool};

/// Longer than a peer's connect timeout (10 s), with room for that peer's
/// own start and first attempts.
const START_DELAY: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_connecting_during_a_slow_start_waits_for_its_answer() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(1);
    let mut cluster = FaultCluster::create(root.path(), 2, |idx, f| {
        if idx == 0 {
            std::fs::write(f.pki.join("minions").join("accepted-before"), &keys[0]).unwrap();
        }
    })
    .await;
    cluster.env[1] = vec![("SALT_KEYSYNC_FAULT_START_DELAY_MS".into(), START_DELAY.as_millis().to_string())];
    // master-b first: it binds its listener at once, then its start lasts
    // START_DELAY. master-a's link tries it from master-a's start on.
    cluster.spawn(1);
    let begun = Instant::now();
    loop {
        let text = std::fs::read_to_string(cluster.log(1)).unwrap_or_default();
        if text.contains("test-only fault injection active") {
            break;
        }
        assert!(begun.elapsed() < Duration::from_secs(30), "master-b did not begin its start:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.start(0).await;
    let a_started = begun.elapsed();
    // `status` on master-b meanwhile says it is starting, instead of timing
    // out ("did not answer").
    let config_b = cluster.files[1].config_path.to_str().unwrap().to_string();
    let status =
        tokio::task::spawn_blocking(move || keysync_tests::binary::run_cli(&["status", "--config", &config_b]))
            .await
            .unwrap();
    let said = String::from_utf8_lossy(&status.stderr).into_owned();
    assert!(!status.status.success(), "status succeeded while master-b was starting: {said}");
    assert!(said.contains("the agent is starting"), "status on master-b while it starts: {said}");
    cluster.started(1).await;
    let b_started = begun.elapsed();
    assert!(
        a_started + Duration::from_secs(10) < b_started,
        "master-a started {a_started:?} and master-b {b_started:?} after master-b began: master-a's first attempts \
         did not fall at least a connect timeout (10 s) inside master-b's start, so they prove nothing"
    );
    converged(&cluster, Duration::from_secs(60)).await;
    assert_eq!(count(&cluster.files[1].pki, "minions"), 1, "master-b has master-a's key");
    let log_a = std::fs::read_to_string(cluster.log(0)).unwrap();
    for timed_out in ["handshake not completed", "timed out after"] {
        assert!(
            !log_a.contains(timed_out),
            "master-a's link to master-b timed out ({timed_out:?}) while master-b started:\n{log_a}"
        );
    }
    cluster.stop_all();
}
