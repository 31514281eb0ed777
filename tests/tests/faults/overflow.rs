//! inotify queue overflow under a burst: events are lost, every name is
//! read again once settled, every key is found, and each operation is still
//! exactly one decision. The kernel's queue limit (`fs.inotify.max_queued_events`)
//! is global to the machine, so lowering it would overflow every other
//! agent's queue too; the test-only knob `SALT_KEYSYNC_FAULT_INOTIFY_OVERFLOW`
//! drops events and reports the overflow exactly as the kernel would.

use std::collections::HashMap;
use std::time::Duration;

use keysync_tests::binary::FaultCluster;
use keysync_tests::wait_until;

use crate::common::{audit, converged, count, key_pool, write_pending};

const N: usize = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inotify_overflow_is_repaired_by_a_rescan() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(8);
    let ids: Vec<String> = (0..N).map(|i| format!("flood{i:03}")).collect();
    let mut cluster = FaultCluster::create(root.path(), 3, |idx, f| {
        if idx == 0 {
            write_pending(&f.pki, ids.iter().cloned(), &keys);
        }
    })
    .await;
    // Let 30 events through, lose the next 500, then report the overflow.
    cluster.env[0] = vec![("SALT_KEYSYNC_FAULT_INOTIFY_OVERFLOW".into(), "30:500".into())];
    cluster.start_all().await;
    let a = cluster.files[0].pki.clone();
    for id in &ids {
        std::fs::rename(a.join("minions_pre").join(id), a.join("minions").join(id)).unwrap();
    }
    for f in &cluster.files {
        wait_until(Duration::from_secs(60), "every key accepted everywhere", || count(&f.pki, "minions") == N).await;
    }
    converged(&cluster, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(cluster.log(0)).unwrap();
    assert!(log.contains("inotify queue overflow (injected)"), "no overflow happened:\n{log}");
    assert!(log.contains("every name is read again once settled"), "the lost events were not noticed:\n{log}");
    let mut accepts: HashMap<String, usize> = HashMap::new();
    for r in audit(&cluster, 0) {
        if r.action == "accept" && r.via == "local" {
            *accepts.entry(r.minion.unwrap()).or_default() += 1;
        }
    }
    assert_eq!(accepts.len(), N, "every key decided on master-a");
    assert!(accepts.values().all(|&n| n == 1), "one decision per operation");
    cluster.stop_all();
}
