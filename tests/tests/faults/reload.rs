//! A link a reload stops lets go of what it was fetching. A joining
//! master's links share its repair: what one link is fetching, the others
//! leave to it. When a reload removed a peer whose link was fetching, its
//! claims stayed, and the other links left those keys to a link that no
//! longer ran: the joiner never got them, until its next restart.
//! `SALT_KEYSYNC_FAULT_FETCH_DELAY_MS` (see agent/src/fault.rs) makes
//! master-b take master-c's fetches and never answer them.

use std::time::Duration;

use keysync_tests::wait_until;

use crate::common::{count, holding_a_fetch, two_agreeing_and_a_joiner};

const N: usize = 3_000;

/// `config` with only the `[[peer]]` section of `name`.
fn only_peer(config: &str, name: &str) -> String {
    let (head, peers) = config.split_once("\n[[peer]]\n").unwrap();
    let kept: Vec<&str> = peers.split("\n[[peer]]\n").filter(|s| s.contains(&format!("name = \"{name}\""))).collect();
    assert_eq!(kept.len(), 1, "{config}");
    format!("{}\n\n[[peer]]\n{}\n", head.trim_end(), kept[0].trim_end())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_peers_link_lets_go_of_what_it_was_fetching() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    // master-c joins with master-b as its only peer at first.
    let mut cluster = two_agreeing_and_a_joiner(root.path(), N).await;
    let (c_pki, c_config) = (cluster.files[2].pki.clone(), cluster.files[2].config_path.clone());
    let full = std::fs::read_to_string(&c_config).unwrap();
    keysync_tests::cluster::write_private(&c_config, only_peer(&full, "master-b"));
    cluster.env[1] = vec![("SALT_KEYSYNC_FAULT_FETCH_DELAY_MS".into(), "3600000".into())];
    cluster.start(0).await;
    cluster.start(1).await;
    cluster.start(2).await;
    holding_a_fetch(&cluster, 1).await;

    // master-a replaces master-b as master-c's peer.
    keysync_tests::cluster::write_private(&c_config, only_peer(&full, "master-a"));
    cluster.signal(2, "HUP");
    // Rounds every second: once master-b's link let go of what it was
    // fetching, master-a's link brings it.
    wait_until(Duration::from_secs(60), "master-c holds every key, from master-a", || count(&c_pki, "minions") == N)
        .await;
    cluster.stop_all();
}
