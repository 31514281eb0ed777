//! A standby master powered off for longer than `tombstone_ttl` (issue 29
//! item 7): while it was off, master-a deleted a key and every running
//! master forgot the delete after the TTL. Started again, the standby hears
//! in `Hello` that its peers forgot a delete newer than its last contact:
//! it offers nothing (its old accept would have come back everywhere), says
//! why, and `rejoin` makes it a new master that takes the site's state. The
//! masters that ran meanwhile are not stale. A month is
//! passed with the test-only clock offset (agent/src/fault.rs).

use std::time::Duration;

use keysync_tests::binary::{run_cli, FaultCluster};
use keysync_tests::salt_ops::{delete_key, move_key, SaltLine};
use keysync_tests::wait_until;

use crate::common::{audited, converged, count, decided, key_pool, write_pending};

const OFFSET: &str = "SALT_KEYSYNC_FAULT_CLOCK_OFFSET_MS";
const DAY_MS: u64 = 86_400_000;

fn status(cluster: &FaultCluster, idx: usize) -> serde_json::Value {
    let config = cluster.files[idx].config_path.to_str().unwrap().to_string();
    let out = run_cli(&["status", "--json", "--config", &config]);
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_off_for_longer_than_the_ttl_offers_nothing_and_rejoins_without_resurrecting() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(4);
    let ids: Vec<String> = (0..4).map(|i| format!("standby{i}")).collect();
    let mut cluster =
        FaultCluster::create(root.path(), 3, |_, f| write_pending(&f.pki, ids.iter().cloned(), &keys)).await;
    cluster.start_all().await;
    let (a, c) = (cluster.files[0].pki.clone(), cluster.files[2].pki.clone());
    for id in &ids {
        move_key(SaltLine::S3008, &a, id, "minions");
    }
    wait_until(Duration::from_secs(30), "the accepts reach master-c", || count(&c, "minions") == 4).await;
    // master-c's first contact is kept at once, by the core step that
    // applied the accepts (a clean stop finishes that step): it has a
    // contact on record from before the delete.
    converged(&cluster, Duration::from_secs(30)).await;

    // The standby is powered off; master-a deletes standby0.
    cluster.stop(2);
    delete_key(&a, "standby0");
    wait_until(Duration::from_secs(30), "the delete reaches master-b", || {
        !decided(&cluster.files[1].pki).contains_key("standby0")
    })
    .await;

    // A month later (31 days, past the 30-day TTL), master-a and master-b
    // forget the delete at their first tick, each before it meets the other
    // again.
    let month = (31 * DAY_MS).to_string();
    for idx in 0..3 {
        cluster.env[idx] = vec![(OFFSET.into(), month.clone())];
    }
    for idx in [0, 1] {
        cluster.stop(idx);
        cluster.start(idx).await;
        let log = std::fs::read_to_string(cluster.log(idx)).unwrap();
        assert!(
            log.contains("test-only fault injection active"),
            "the agent binary lacks the fault-injection feature: run `cargo test --workspace` (or \
             `cargo build -p salt-keysync --features fault-injection`) before this test"
        );
        wait_until(Duration::from_secs(30), "the delete is compacted", || {
            status(&cluster, idx)["keys"]["deleted"] == 0
        })
        .await;
    }
    // Neither is stale once it heard the other's Hello (a link is up after
    // its Hello, whose forgot-through the core takes before it answers
    // `status`). master-a forgot the delete master-b heard just before its
    // stop, within the hour of its contact on record: the contact that
    // brought it was kept at once (stale.rs).
    for (idx, other) in [(0, "master-b"), (1, "master-a")] {
        wait_until(Duration::from_secs(30), "the link to the other restarted master is up", || {
            status(&cluster, idx)["peers"]
                .as_array()
                .is_some_and(|peers| peers.iter().any(|p| p["name"] == other && p["state"] == "up"))
        })
        .await;
        assert!(status(&cluster, idx)["stale"].is_null(), "{} ran all along", cluster.files[idx].name);
    }

    // The standby starts again with its old folders and store: it offers
    // nothing, and says so.
    cluster.start(2).await;
    wait_until(Duration::from_secs(30), "master-a links to master-c", || {
        status(&cluster, 0)["peers"]
            .as_array()
            .is_some_and(|peers| peers.iter().any(|p| p["name"] == "master-c" && p["state"] == "up"))
    })
    .await;
    let stale = status(&cluster, 2)["stale"].as_str().unwrap_or_default().to_string();
    assert!(stale.starts_with("out of contact with every peer since") && stale.contains("rejoin"), "{stale}");
    assert_eq!(audited(&cluster, 2, "stale", "refused").len(), 1);
    // master-a's round on connect asked master-c's Diff: give a few more seconds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for idx in [0, 1] {
        assert!(
            !decided(&cluster.files[idx].pki).contains_key("standby0"),
            "standby0, deleted a month ago, came back on {}",
            cluster.files[idx].name
        );
    }
    assert!(decided(&c).contains_key("standby0"), "master-c wrote nothing either");

    // The way out: rejoin, with the agent stopped.
    cluster.stop(2);
    let config = cluster.files[2].config_path.to_str().unwrap().to_string();
    // On master-c's clock (a month on), as the agent's.
    let rejoin = |flag: &str| {
        std::process::Command::new(keysync_tests::binary::binary())
            .args(["rejoin", flag, "--config", &config])
            .env(OFFSET, (31 * DAY_MS).to_string())
            .output()
            .unwrap()
    };
    let dry = rejoin("--dry-run");
    let dry_text = format!("{}{}", String::from_utf8_lossy(&dry.stdout), String::from_utf8_lossy(&dry.stderr));
    assert!(dry.status.success() && dry_text.contains("nothing changed"), "{dry_text}");
    assert_eq!(count(&c, "minions"), 4, "--dry-run changed nothing");
    let out = rejoin("-y");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("set aside 4 key(s)"), "{text}");
    assert_eq!(count(&c, "minions"), 0);
    cluster.start(2).await;
    wait_until(Duration::from_secs(30), "master-c takes the site's keys", || count(&c, "minions") == 3).await;
    converged(&cluster, Duration::from_secs(30)).await;
    for idx in 0..3 {
        assert!(!decided(&cluster.files[idx].pki).contains_key("standby0"), "standby0 is deleted everywhere");
    }
    assert!(status(&cluster, 2)["stale"].is_null(), "a new master is not stale");
    cluster.stop_all();
}
