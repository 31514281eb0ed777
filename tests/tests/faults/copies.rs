//! Second copies of live pushes, while a path loses packets or has not told
//! yet whether it does. Loopback loses none, and tells within a few seconds
//! once either end probes it, so two knobs make the other cases:
//! - master-a and master-c send no probes (`SALT_KEYSYNC_FAULT_NO_PROBES`):
//!   with rounds a minute apart their path sends a few segments a minute,
//!   too few to tell for the whole test, and each live push on it goes twice;
//! - master-b takes its path to master-a for a lossy one
//!   (`SALT_KEYSYNC_FAULT_LOSSY`): its pushes there go twice, and those to
//!   master-c, whose path its probes found clean, once.
//!
//! Every copy reaches its peer, which applies and audits each decision once.

use std::time::Duration;

use keysync_tests::binary::{free_addr, FaultCluster};
use keysync_tests::probe::{metrics_text, write_private};
use keysync_tests::salt_ops::path;
use keysync_tests::wait_until;

use crate::common::{audited, converged, key_pool, with_metrics, write_pending};

/// The sum of a counter's series whose labels contain each of `labels` (0 if none).
fn counter(text: &str, name: &str, labels: &[&str]) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.trim().parse::<u64>().ok()))
        .sum()
}

/// Whether master `idx`'s link to `peer` has said `what` in its log.
fn said(cluster: &FaultCluster, idx: usize, peer: &str, what: &str) -> bool {
    let log = std::fs::read_to_string(cluster.log(idx)).unwrap_or_default();
    log.lines().any(|l| l.contains(&format!("peer={peer} ")) && l.contains(what))
}

/// Accepts `ids` on the master of `pki` one at a time, each pushed live,
/// and waits for every master to agree.
async fn accept_one_by_one(cluster: &FaultCluster, pki: &std::path::Path, ids: &[String]) {
    for id in ids {
        std::fs::rename(path(pki, "minions_pre", id), path(pki, "minions", id)).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    converged(cluster, Duration::from_secs(30)).await;
}

/// Master `idx`'s copies to `peer` so far.
fn copied(metrics: std::net::SocketAddr, peer: &str) -> u64 {
    counter(&metrics_text(metrics), "keysync_decisions_copied_total", &[&format!("peer=\"{peer}\"")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_pushes_go_twice_while_a_path_loses_packets_or_has_not_told() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(4);
    let from_a: Vec<String> = (0..10).map(|i| format!("web{i:02}")).collect();
    let from_b: Vec<String> = (0..10).map(|i| format!("db{i:02}")).collect();
    let metrics = [free_addr(), free_addr(), free_addr()];
    let mut cluster = FaultCluster::create(root.path(), 3, |i, f| {
        write_pending(&f.pki, from_a.iter().chain(&from_b).cloned().chain(["back".to_string()]), &keys);
        with_metrics(f, metrics[i]);
        // Rounds a minute apart, as in production: the path between
        // master-a and master-c carries a few segments a minute, too few to
        // tell for the whole test however slow the machine (every second,
        // it would pass 400 segments within a minute or two).
        let config = std::fs::read_to_string(&f.config_path).unwrap();
        let config = config.replace("anti_entropy_interval = \"1s\"", "anti_entropy_interval = \"60s\"");
        assert!(config.contains("anti_entropy_interval = \"60s\""), "rounds a minute apart:\n{config}");
        write_private(&f.config_path, &config);
    })
    .await;
    let no_probes = vec![("SALT_KEYSYNC_FAULT_NO_PROBES".to_string(), "1".to_string())];
    cluster.env[0] = no_probes.clone();
    cluster.env[1] = vec![("SALT_KEYSYNC_FAULT_LOSSY".into(), "master-a".into())];
    cluster.env[2] = no_probes;
    cluster.start_all().await;
    let (a, b, c) = (cluster.files[0].pki.clone(), cluster.files[1].pki.clone(), cluster.files[2].pki.clone());
    for idx in 0..3 {
        wait_until(Duration::from_secs(30), "the links are up", || {
            std::fs::read_to_string(cluster.log(idx)).unwrap_or_default().matches(" connected n_decisions").count() >= 2
        })
        .await;
    }
    // master-b's links have probed their paths: the one to master-c found
    // it clean (loopback resent nothing), the one to master-a lossy (the knob).
    for peer in ["master-a", "master-c"] {
        wait_until(Duration::from_secs(60), "the link probed its path", || {
            said(&cluster, 1, peer, "the link probed its path")
        })
        .await;
    }
    wait_until(Duration::from_secs(30), "master-b's link to master-c pushes once", || {
        said(&cluster, 1, "master-c", "live pushes go once")
    })
    .await;

    // master-a accepts one key at a time, each pushed live.
    accept_one_by_one(&cluster, &a, &from_a).await;
    // Each, but for one the copy stream could not take at once (it takes
    // four at a time, and sends them as they come).
    let a_to_c = copied(metrics[0], "master-c");
    assert!(a_to_c >= from_a.len() as u64 / 2, "master-a's untold path to master-c: {a_to_c} copied");
    let log = std::fs::read_to_string(cluster.log(0)).unwrap();
    assert!(log.contains("has sent too little to tell whether its path loses packets"), "said:\n{log}");
    assert!(!log.contains("the link probed its path"), "master-a sent no probes:\n{log}");
    // Both copies reach master-c (the second is read after the first is applied).
    wait_until(Duration::from_secs(30), "master-c received every copy", || {
        let received = counter(
            &metrics_text(metrics[2]),
            "keysync_decisions_received_total",
            &["peer=\"master-a\"", "how=\"push\""],
        );
        received >= from_a.len() as u64 + a_to_c
    })
    .await;
    let applied = audited(&cluster, 2, "accept", "applied");
    for id in &from_a {
        let n = applied.iter().filter(|r| r.minion.as_deref() == Some(id.as_str())).count();
        assert_eq!(n, 1, "master-c applied and audited {id} once, copies or not");
    }

    // master-b: twice to master-a (lossy), once to master-c (probed clean).
    accept_one_by_one(&cluster, &b, &from_b).await;
    let b_to_a = copied(metrics[1], "master-a");
    assert!(b_to_a >= from_b.len() as u64 / 2, "master-b's lossy path to master-a: {b_to_a} copied");
    assert_eq!(copied(metrics[1], "master-c"), 0, "master-b's path to master-c, probed and clean: no copies");
    let log = std::fs::read_to_string(cluster.log(1)).unwrap();
    assert!(log.contains("the path to the peer loses packets"), "said:\n{log}");

    // master-c: its path to master-a untold, its first push there copied.
    std::fs::rename(path(&c, "minions_pre", "back"), path(&c, "minions", "back")).unwrap();
    converged(&cluster, Duration::from_secs(30)).await;
    assert!(copied(metrics[2], "master-a") >= 1, "master-c's untold path to master-a");
    assert!(!std::fs::read_to_string(cluster.log(2)).unwrap().contains("the path to the peer loses packets"));
    let back = audited(&cluster, 0, "accept", "applied").into_iter().filter(|r| r.minion.as_deref() == Some("back"));
    assert_eq!(back.count(), 1, "master-a applied master-c's accept once");
    cluster.stop_all();
}
