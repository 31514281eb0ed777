//! Partitions between all three masters while each takes conflicting
//! decisions on the same minions: after healing, all folders are identical
//! and hold what the version rule says (the highest version wins), and each
//! pair of concurrent decisions is audited once per master however often they come back.

use std::collections::HashMap;
use std::time::Duration;

use keysync_tests::binary::FaultCluster;
use keysync_tests::salt_ops::{delete_key, move_key, SaltLine};
use keysync_tests::wait_until;

use crate::common::{assert_winners_applied, audit, audited, converged_releasing, key_pool, write_pending};

const N: usize = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_decisions_in_a_partition_converge_to_the_highest_version() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(N);
    let ids: Vec<String> = (0..N).map(|i| format!("split{i:02}")).collect();
    // Every master has every minion's (same) key pending, as minions send it to all.
    let mut cluster =
        FaultCluster::create(root.path(), 3, |_, f| write_pending(&f.pki, ids.iter().cloned(), &keys)).await;
    cluster.start_all().await;
    // Decided everywhere first, so deletes are decisions too.
    let (a, b, c) = (cluster.files[0].pki.clone(), cluster.files[1].pki.clone(), cluster.files[2].pki.clone());
    for id in &ids {
        move_key(SaltLine::S3006, &a, id, "minions");
    }
    wait_until(Duration::from_secs(60), "the accepts reach every master", || {
        cluster.files.iter().all(|f| crate::common::count(&f.pki, "minions") == N)
    })
    .await;

    cluster.partition(&[&[0], &[1], &[2]]);
    for (i, id) in ids.iter().enumerate() {
        move_key(SaltLine::S3008, &a, id, "minions_rejected");
        delete_key(&b, id);
        if i % 3 == 0 {
            move_key(SaltLine::S3006, &c, id, "minions_rejected");
        } else if i % 3 == 1 {
            delete_key(&c, id);
        }
    }
    let local = |idx: usize| audit(&cluster, idx).into_iter().filter(|r| r.via == "local" && r.outcome == "applied");
    let want = [2 * N, N, N * 2 / 3];
    for (idx, &n) in want.iter().enumerate() {
        wait_until(Duration::from_secs(30), "local decisions recorded during the partition", || {
            local(idx).filter(|r| ["accept", "reject", "delete"].contains(&r.action.as_str())).count() >= n
        })
        .await;
    }

    cluster.heal();
    // master-b deleted every key master-c still had accepted: to master-c's
    // guard a mass delete, held until an operator releases it, unless
    // master-a's rejections (which win where they are later) reach it first;
    // which comes first depends on timing, so either is fine here.
    converged_releasing(&cluster, Duration::from_secs(60)).await;
    for idx in 0..3 {
        assert_winners_applied(&cluster, idx);
    }
    // A few anti-entropy rounds offer the losers again: still one record each.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut n_conflicts = 0;
    for idx in 0..3 {
        // Each pair of concurrent decisions once (three concurrent decisions are three pairs).
        let mut seen: HashMap<(String, String, String), usize> = HashMap::new();
        for r in audited(&cluster, idx, "conflict", "resolved") {
            let pair = (r.minion.clone().unwrap(), r.version.clone().unwrap(), r.other_version.clone().unwrap());
            *seen.entry(pair).or_default() += 1;
        }
        n_conflicts += seen.len();
        let repeated: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
        assert!(repeated.is_empty(), "{}: conflicts audited more than once: {repeated:?}", cluster.files[idx].name);
    }
    assert!(n_conflicts >= N, "every minion had concurrent decisions: {n_conflicts} conflicts audited");
    cluster.stop_all();
}
