//! A peer that takes a Fetch and never answers it holds nothing for long.
//! A joining master's links share its repair: what one link is fetching,
//! the others leave to it. HTTP/2 keep-alives only show the connection
//! lives, so a peer (a compromised master: SECURITY.md) could take a Fetch,
//! never answer it, and keep the joiner from ever getting those keys from
//! anyone. `SALT_KEYSYNC_FAULT_FETCH_DELAY_MS` (see agent/src/fault.rs)
//! makes master-b do that; `SALT_KEYSYNC_FAULT_ANSWER_DEADLINE_MS` shortens
//! master-c's wait for a whole answer (300 s) to 3 s.

use std::time::Duration;

use keysync_tests::wait_until;

use crate::common::{count, holding_a_fetch, two_agreeing_and_a_joiner};

const N: usize = 3_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_answers_a_fetch_holds_its_keys_for_a_while_only() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let mut cluster = two_agreeing_and_a_joiner(root.path(), N).await;
    cluster.env[1] = vec![("SALT_KEYSYNC_FAULT_FETCH_DELAY_MS".into(), "3600000".into())];
    cluster.env[2] = vec![("SALT_KEYSYNC_FAULT_ANSWER_DEADLINE_MS".into(), "3000".into())];
    let c_pki = cluster.files[2].pki.clone();
    // Only master-c's links bring it anything: its peers' own rounds
    // cannot reach it (they would push it what it lacks).
    cluster.cut_one_way(0, 2);
    cluster.cut_one_way(1, 2);
    // master-a is not up yet: master-c's link to master-b claims what it
    // fetches first, and master-b holds that fetch.
    cluster.start(1).await;
    cluster.start(2).await;
    holding_a_fetch(&cluster, 1).await;

    // master-a comes up: whatever master-b's link does not hold it brings
    // at once; what master-b's link held, once its wait ran out.
    cluster.start(0).await;
    wait_until(Duration::from_secs(60), "master-c holds every key, from master-a", || count(&c_pki, "minions") == N)
        .await;
    let c_log = std::fs::read_to_string(cluster.log(2)).unwrap();
    let timed_out = |line: &&str| {
        line.contains("peer=master-b") && line.contains("the peer's answer to Fetch timed out: not begun within 3 s")
    };
    assert!(c_log.lines().any(|line| timed_out(&line)), "{c_log}");
    cluster.stop_all();
}
