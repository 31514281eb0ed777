//! A link a reload stops lets go of what it was fetching. A joining
//! master's links share its repair: what one link is fetching, the others
//! leave to it. When a reload removed a peer whose link was fetching, its
//! claims stayed, and the other links left those keys to a link that no
//! longer ran: the joiner never got them, until its next restart.
//! `SALT_KEYSYNC_FAULT_FETCH_DELAY_MS` (see agent/src/fault.rs) makes
//! master-b take master-c's fetches and never answer them.

use std::time::Duration;

use keysync_tests::binary::FaultCluster;
use keysync_tests::wait_until;

use crate::common::{count, key_pool};

const N: usize = 3_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_peers_link_lets_go_of_what_it_was_fetching() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(8);
    // master-a and master-b agree on N keys; master-c joins empty.
    let mut cluster = FaultCluster::create(root.path(), 3, |idx, f| {
        if idx < 2 {
            for i in 0..N {
                std::fs::write(f.pki.join("minions").join(format!("web{i:04}")), &keys[i % keys.len()]).unwrap();
            }
        }
    })
    .await;
    cluster.env[1] = vec![("SALT_KEYSYNC_FAULT_FETCH_DELAY_MS".into(), "3600000".into())];
    cluster.start(0).await;
    cluster.start(1).await;
    cluster.start(2).await;
    let b_log = cluster.log(1);
    let (c_pki, c_config) = (cluster.files[2].pki.clone(), cluster.files[2].config_path.clone());
    wait_until(Duration::from_secs(60), "master-b holds a fetch of master-c's", || {
        std::fs::read_to_string(&b_log).unwrap_or_default().contains("holding a fetch's answer")
    })
    .await;
    wait_until(Duration::from_secs(60), "master-c fetched what master-a was asked for", || {
        count(&c_pki, "minions") > 0
    })
    .await;

    // master-b is no longer master-c's peer.
    let text = std::fs::read_to_string(&c_config).unwrap();
    let (head, peers) = text.split_once("\n[[peer]]\n").unwrap();
    let kept: Vec<&str> = peers.split("\n[[peer]]\n").filter(|s| !s.contains("name = \"master-b\"")).collect();
    assert_eq!(kept.len(), 1, "{text}");
    let new_text = format!("{}\n\n[[peer]]\n{}\n", head.trim_end(), kept[0].trim_end());
    keysync_tests::cluster::write_private(&c_config, new_text);
    cluster.signal(2, "HUP");
    // Rounds every second: once the claims are let go, the next round over
    // master-a's link brings the rest.
    wait_until(Duration::from_secs(60), "master-c holds every key, from master-a", || count(&c_pki, "minions") == N)
        .await;
    cluster.stop_all();
}
