//! A link's anti-entropy round waits while the peer is fetching from this
//! master in a round of its own (a joining master), and runs once the
//! peer's round is over: a decision that neither the peer's round nor a live
//! push carried arrives a few seconds later, not an `anti_entropy_interval`
//! (here an hour) later.

use std::time::Duration;

use keysync_tests::binary::FaultCluster;
use keysync_tests::salt_ops::{move_key, path, SaltLine};
use keysync_tests::wait_until;

use crate::common::{audited, count, key_pool};

const N: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_left_to_a_joining_peer_runs_once_its_round_is_over() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(4);
    // master-a holds N accepted keys and one pending; master-b joins empty.
    // Rounds every hour: only the rounds at connect, and the one a round
    // left to the peer is run again with, carry anything.
    let mut cluster = FaultCluster::create(root.path(), 2, |idx, f| {
        let text = std::fs::read_to_string(&f.config_path).unwrap();
        let text = text.replace("anti_entropy_interval = \"1s\"", "anti_entropy_interval = \"1h\"");
        assert!(text.contains("anti_entropy_interval = \"1h\""));
        std::fs::write(&f.config_path, text).unwrap();
        if idx == 0 {
            for i in 0..N {
                std::fs::write(f.pki.join("minions").join(format!("held{i:03}")), &keys[i % keys.len()]).unwrap();
            }
            std::fs::write(f.pki.join("minions_pre").join("late"), &keys[0]).unwrap();
        }
    })
    .await;
    // master-a's link to master-b is down: only master-b's link to master-a
    // works, and master-b's join fetches everything over it.
    cluster.cut_one_way(0, 1);
    cluster.start(0).await;
    cluster.start(1).await;
    let b = cluster.files[1].pki.clone();
    wait_until(Duration::from_secs(60), "master-b fetched master-a's keys", || count(&b, "minions") == N).await;

    // Accepted on master-a after master-b's round compared digests, while
    // master-a's link is down: no live push carries it, and master-b's round
    // does not know of it.
    let a = cluster.files[0].pki.clone();
    move_key(SaltLine::S3006, &a, "late", "minions");
    wait_until(Duration::from_secs(30), "master-a recorded its accept", || {
        audited(&cluster, 0, "accept", "applied").iter().any(|r| r.minion.as_deref() == Some("late"))
    })
    .await;
    // The link comes up while master-b has just fetched (within 5 s, unless
    // this machine is very slow: then the round runs at once, which carries
    // the key as well). Its round is left to master-b, and run again 5 s on.
    cluster.heal();
    wait_until(Duration::from_secs(30), "the accept reaches master-b", || path(&b, "minions", "late").exists()).await;
    assert_eq!(std::fs::read_to_string(path(&b, "minions", "late")).unwrap(), keys[0]);
    cluster.stop_all();
}
