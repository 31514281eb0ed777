//! Regression (issue 2 review, "bugs the simulation found"): a peer's
//! decision arriving while a salt-key run on the same id is still in progress
//! here (Salt 3008: removed from every folder, tmp file written, not yet
//! renamed) is deferred until the run has settled. Applied at once, it put
//! the id into `minions/` next to the `minions_rejected/` file salt-key then
//! renamed into place: two folders on one master, one on the others.

use std::time::Duration;

use keysync_tests::binary::FaultCluster;
use keysync_tests::salt_ops::path;
use keysync_tests::wait_until;

use crate::common::{assert_winners_applied, converged, decided, key_pool, write_pending};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_decision_waits_for_a_salt_key_run_in_progress() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(1);
    let mut cluster =
        FaultCluster::create(root.path(), 3, |_, f| write_pending(&f.pki, ["web01".to_string()], &keys)).await;
    cluster.env[1] = vec![("SALT_KEYSYNC_LOG".into(), "info,salt_keysync::node=debug".into())];
    cluster.start_all().await;
    let (a, b) = (cluster.files[0].pki.clone(), cluster.files[1].pki.clone());

    // master-b: `salt-key -r web01` (3008) is half-way: gone from every folder, tmp written.
    std::fs::remove_file(path(&b, "minions_pre", "web01")).unwrap();
    // The tmp file stays open, as while Salt writes it: the id stays unsettled
    // until it is closed (up to the settler's 5 s hold), whatever the load.
    let tmp = path(&b, "minions_rejected", "tmpq8d7k2x1");
    let mut writing = std::fs::File::create(&tmp).unwrap();
    let (head, tail) = keys[0].as_bytes().split_at(40);
    std::io::Write::write_all(&mut writing, head).unwrap();
    // Meanwhile master-a accepts web01.
    std::fs::rename(path(&a, "minions_pre", "web01"), path(&a, "minions", "web01")).unwrap();
    wait_until(Duration::from_secs(4), "master-b defers the accept", || {
        std::fs::read_to_string(cluster.log(1))
            .unwrap_or_default()
            .contains("deferred: the id's own events are settling")
    })
    .await;
    assert!(!path(&b, "minions", "web01").exists(), "nothing written while salt-key runs");
    // salt-key on master-b finishes.
    std::io::Write::write_all(&mut writing, tail).unwrap();
    drop(writing);
    std::fs::rename(&tmp, path(&b, "minions_rejected", "web01")).unwrap();

    converged(&cluster, Duration::from_secs(30)).await;
    for (idx, f) in cluster.files.iter().enumerate() {
        let state = decided(&f.pki);
        assert_eq!(state.len(), 1, "{}: web01 in one folder only: {:?}", f.name, state.keys());
        assert_winners_applied(&cluster, idx);
    }
    cluster.stop_all();
}
