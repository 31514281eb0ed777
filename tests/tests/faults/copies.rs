//! Second copies of live pushes on a path that loses packets. Loopback loses
//! none, so master-a's link to master-b takes its path for a lossy one
//! (`SALT_KEYSYNC_FAULT_LOSSY`): each live decision goes to master-b twice,
//! once on each of the link's connections, and master-b applies and audits
//! it once. master-a's link to master-c, which has sent too little to tell,
//! copies too while master-a's other path loses packets. master-b reads its
//! own connections' TCP counters, which say loopback resent nothing, and
//! its other links find nothing either: it pushes each decision once.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_lossy_path_each_live_push_goes_twice_and_is_applied_once() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(4);
    let ids: Vec<String> = (0..20).map(|i| format!("web{i:02}")).collect();
    let metrics = [free_addr(), free_addr(), free_addr()];
    let mut cluster = FaultCluster::create(root.path(), 3, |i, f| {
        write_pending(&f.pki, ids.iter().cloned().chain(["back".to_string()]), &keys);
        with_metrics(f, metrics[i]);
        // Rounds a minute apart, as in production: the link to master-c
        // sends a few segments a minute, and has sent too little to tell
        // for the whole test however slow the machine (every second, it
        // would pass 200 segments within a minute or so).
        let config = std::fs::read_to_string(&f.config_path).unwrap();
        let config = config.replace("anti_entropy_interval = \"1s\"", "anti_entropy_interval = \"60s\"");
        write_private(&f.config_path, &config);
    })
    .await;
    cluster.env[0] = vec![("SALT_KEYSYNC_FAULT_LOSSY".into(), "master-b".into())];
    cluster.start_all().await;
    let (a, b) = (cluster.files[0].pki.clone(), cluster.files[1].pki.clone());
    for idx in 0..3 {
        wait_until(Duration::from_secs(30), "the links are up", || {
            std::fs::read_to_string(cluster.log(idx)).unwrap_or_default().matches(" connected n_decisions").count() >= 2
        })
        .await;
    }

    // master-a accepts one key at a time, each pushed live.
    for id in &ids {
        std::fs::rename(path(&a, "minions_pre", id), path(&a, "minions", id)).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    converged(&cluster, Duration::from_secs(30)).await;
    let copied = counter(&metrics_text(metrics[0]), "keysync_decisions_copied_total", &["peer=\"master-b\""]);
    // Each, but for one the copy stream could not take at once (it takes
    // four at a time, and sends them as they come).
    assert!(copied >= ids.len() as u64 / 2, "master-a copied its live pushes on the lossy path: {copied}");
    // Both copies reach master-b (the second is read after the first is applied).
    wait_until(Duration::from_secs(30), "master-b received every copy", || {
        let received = counter(
            &metrics_text(metrics[1]),
            "keysync_decisions_received_total",
            &["peer=\"master-a\"", "how=\"push\""],
        );
        received >= ids.len() as u64 + copied
    })
    .await;
    let applied = audited(&cluster, 1, "accept", "applied");
    for id in &ids {
        let n = applied.iter().filter(|r| r.minion.as_deref() == Some(id.as_str())).count();
        assert_eq!(n, 1, "master-b applied and audited {id} once, copies or not");
    }
    let log = std::fs::read_to_string(cluster.log(0)).unwrap();
    assert!(log.contains("the path to the peer loses packets"), "said:\n{log}");
    // The link to master-c: too little sent to tell, another path lossy.
    let to_c = counter(&metrics_text(metrics[0]), "keysync_decisions_copied_total", &["peer=\"master-c\""]);
    assert!(to_c >= 1, "master-a's link to master-c copied as its other path loses packets: {to_c}");
    assert!(log.contains("another link of this master's does"), "said:\n{log}");

    // master-b's paths are loopback, which resent nothing: one push each.
    std::fs::rename(path(&b, "minions_pre", "back"), path(&b, "minions", "back")).unwrap();
    converged(&cluster, Duration::from_secs(30)).await;
    let copied = counter(&metrics_text(metrics[1]), "keysync_decisions_copied_total", &[]);
    assert_eq!(copied, 0, "no copies on a path that loses nothing");
    assert!(!std::fs::read_to_string(cluster.log(1)).unwrap().contains("loses packets"));
    let back = audited(&cluster, 0, "accept", "applied").into_iter().filter(|r| r.minion.as_deref() == Some("back"));
    assert_eq!(back.count(), 1, "master-a applied master-b's accept once");
    cluster.stop_all();
}
