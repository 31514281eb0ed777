//! Three in-process agents with real TLS and real pki folders replicate
//! what Salt-style file operations do on any of them.

use std::time::Duration;

use keysync_tests::cluster::TestCluster;
use keysync_tests::salt_ops::{
    delete_key, find, master_writes_pending, move_key, new_public_key, path, SaltLine, FOLDERS,
};
use keysync_tests::wait_until;

const SETTLE: Duration = Duration::from_secs(10);

/// Waits until `id` is exactly in `folder` with `key` (or in no folder) on
/// every agent in `on`.
async fn converged(cluster: &TestCluster, on: &[usize], id: &str, want: Option<(&str, &str)>) {
    for &idx in on {
        let pki = cluster.pki(idx);
        let what = format!("{id} on {} should be {want:?}", cluster.agents[idx].name());
        wait_until(SETTLE, &what, || {
            let present: Vec<&str> = FOLDERS.iter().copied().filter(|f| path(pki, f, id).exists()).collect();
            match want {
                None => present.is_empty(),
                Some((folder, key)) => {
                    present == [folder] && std::fs::read(path(pki, folder, id)).unwrap() == key.as_bytes()
                }
            }
        })
        .await;
    }
}

async fn pending_everywhere(cluster: &TestCluster, id: &str, key: &str) {
    for idx in 0..cluster.agents.len() {
        master_writes_pending(cluster.pki(idx), id, key);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_reject_delete_from_every_master_in_both_salt_patterns() {
    let cluster = TestCluster::start(3).await;
    let all = [0, 1, 2];
    for line in [SaltLine::S3006, SaltLine::S3008] {
        for origin in all {
            let id = format!("web-{origin}-{line:?}");
            let key = new_public_key();
            pending_everywhere(&cluster, &id, &key).await;
            move_key(line, cluster.pki(origin), &id, "minions");
            converged(&cluster, &all, &id, Some(("minions", &key))).await;
            move_key(line, cluster.pki(origin), &id, "minions_rejected");
            converged(&cluster, &all, &id, Some(("minions_rejected", &key))).await;
            delete_key(cluster.pki(origin), &id);
            converged(&cluster, &all, &id, None).await;
        }
    }
    // Files land before their audit record: wait for the last one.
    wait_until(SETTLE, "every agent audited the last delete", || {
        cluster.agents.iter().all(|agent| {
            agent.audit().iter().any(|r| r.minion.as_deref() == Some("web-2-S3008") && r.action == "delete")
        })
    })
    .await;
    for (idx, agent) in cluster.agents.iter().enumerate() {
        let audit = agent.audit();
        // One decision per operation: an accept never shows up as a delete first.
        for origin in all {
            for line in ["S3006", "S3008"] {
                let id = format!("web-{origin}-{line}");
                let actions: Vec<&str> = audit
                    .iter()
                    .filter(|r| r.minion.as_deref() == Some(&id) && r.outcome == "applied")
                    .map(|r| r.action.as_str())
                    .collect();
                assert_eq!(actions, ["accept", "reject", "delete"], "{id} on agent {idx}");
            }
        }
        // A revocation applied from a peer makes the master rotate its AES key.
        let dfn = agent.files.dir.join("cache/.dfn");
        assert!(dfn.exists(), "{} has no .dfn", agent.name());
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_while_an_agent_was_stopped_are_found_at_restart() {
    let mut cluster = TestCluster::start(3).await;
    let (kept, dropped, fresh) = (new_public_key(), new_public_key(), new_public_key());
    pending_everywhere(&cluster, "kept", &kept).await;
    pending_everywhere(&cluster, "dropped", &dropped).await;
    move_key(SaltLine::S3008, cluster.pki(0), "kept", "minions");
    move_key(SaltLine::S3006, cluster.pki(0), "dropped", "minions");
    converged(&cluster, &[0, 1, 2], "dropped", Some(("minions", &dropped))).await;
    converged(&cluster, &[0, 1, 2], "kept", Some(("minions", &kept))).await;

    cluster.stop(2).await;
    delete_key(cluster.pki(2), "dropped");
    master_writes_pending(cluster.pki(2), "fresh", &fresh);
    move_key(SaltLine::S3008, cluster.pki(2), "fresh", "minions_rejected");
    cluster.restart(2).await;

    converged(&cluster, &[0, 1, 2], "dropped", None).await;
    converged(&cluster, &[0, 1, 2], "fresh", Some(("minions_rejected", &fresh))).await;
    converged(&cluster, &[0, 1, 2], "kept", Some(("minions", &kept))).await;
    let audit = cluster.agents[2].audit();
    assert!(audit.iter().any(|r| r.minion.as_deref() == Some("dropped")
        && r.action == "delete"
        && r.via == "local"
        && r.reason.as_deref() == Some("changed while the agent was stopped")));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_spreads_through_a_peer_while_its_origin_is_down() {
    let mut cluster = TestCluster::start(3).await;
    let key = new_public_key();
    // a cannot reach c, and b cannot reach c either for now.
    cluster.partition(&[&[0, 1], &[2]]);
    pending_everywhere(&cluster, "relayed", &key).await;
    move_key(SaltLine::S3008, cluster.pki(0), "relayed", "minions");
    converged(&cluster, &[0, 1], "relayed", Some(("minions", &key))).await;
    cluster.stop(0).await;
    assert_eq!(find(cluster.pki(2), "relayed").unwrap().0, "minions_pre");
    // Only b can tell c now.
    cluster.heal();
    converged(&cluster, &[2], "relayed", Some(("minions", &key))).await;
    wait_until(SETTLE, "c audits the accept as made on a and received from b", || {
        cluster.agents[2].audit().iter().any(|r| {
            r.minion.as_deref() == Some("relayed")
                && r.outcome == "applied"
                && (r.origin.as_deref(), r.via.as_str()) == (Some("master-a"), "master-b")
        })
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_and_reject_made_during_a_partition_converge_as_a_conflict() {
    let cluster = TestCluster::start(3).await;
    let key = new_public_key();
    pending_everywhere(&cluster, "split", &key).await;
    cluster.partition(&[&[0], &[1], &[2]]);
    // Let the cut connections notice before deciding.
    tokio::time::sleep(Duration::from_millis(300)).await;
    move_key(SaltLine::S3006, cluster.pki(0), "split", "minions");
    // a's decision is made (and stamped) before b's operator acts: b decides last.
    wait_until(SETTLE, "a decided the accept", || {
        cluster.agents[0].audit().iter().any(|r| r.action == "accept" && r.minion.as_deref() == Some("split"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    move_key(SaltLine::S3008, cluster.pki(1), "split", "minions_rejected");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(find(cluster.pki(0), "split").unwrap().0, "minions");
    assert_eq!(find(cluster.pki(1), "split").unwrap().0, "minions_rejected");
    cluster.heal();
    // b decided last, so its reject wins everywhere.
    converged(&cluster, &[0, 1, 2], "split", Some(("minions_rejected", &key))).await;
    // The conflict is audited where both decisions meet, which always
    // includes the master whose decision lost.
    wait_until(SETTLE, "the conflict is audited on master-a", || {
        cluster.agents[0].audit().iter().any(|r| {
            r.action == "conflict"
                && r.minion.as_deref() == Some("split")
                && r.version.as_deref().is_some_and(|v| v.ends_with("@master-b"))
                && r.other_version.as_deref().is_some_and(|v| v.ends_with("@master-a"))
                && r.reason.as_deref().is_some_and(|why| {
                    why.starts_with("reject ")
                        && why.contains(" at master-b and accept ")
                        && why.contains("concurrently")
                })
        })
    })
    .await;
    cluster.shutdown().await;
}

/// A live push is not held back by a round's bytes: on one connection it
/// went out behind whatever the link had sent before it, such as a round's
/// 8 KB of digests (at 300 ms RTT under BBR, a round trip more). Here what
/// master-a's link sends master-b crawls at 1 KiB/s per connection, and
/// master-b's link to master-a is cut (its rounds would fetch the decision):
/// a decision made while a round's digests wait in the relay arrives long
/// before they could have drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_push_never_waits_behind_a_rounds_bytes() {
    const RATE: usize = 1024;
    const HELD: usize = 6 * 1024;
    let cluster = TestCluster::start(2).await;
    let (warm, live) = (new_public_key(), new_public_key());
    pending_everywhere(&cluster, "warm", &warm).await;
    pending_everywhere(&cluster, "live", &live).await;
    // The link is up and has pushed once.
    move_key(SaltLine::S3008, cluster.pki(0), "warm", "minions");
    converged(&cluster, &[1], "warm", Some(("minions", &warm))).await;

    cluster.cut_one_way(1, 0);
    cluster.throttle(0, 1, Some(RATE));
    // Rounds run every second: the next one's digests wait in the relay.
    wait_until(Duration::from_secs(30), "a round's digests wait in a connection from master-a to master-b", || {
        cluster.most_held(0, 1) >= HELD
    })
    .await;
    let decided = std::time::Instant::now();
    move_key(SaltLine::S3008, cluster.pki(0), "live", "minions");
    converged(&cluster, &[1], "live", Some(("minions", &live))).await;
    let took = decided.elapsed();
    // Behind the digests it would take HELD / RATE = 6 s at least.
    assert!(
        took < Duration::from_secs(4),
        "the accept took {took:?} to reach master-b: it waited behind the round's bytes ({HELD} B or more at {RATE} B/s)"
    );
    cluster.throttle(0, 1, None);
    cluster.heal();
    cluster.shutdown().await;
}
