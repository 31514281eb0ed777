//! `keysync-bench --wan` in its smallest configuration (3 masters, 10 ms
//! RTT, a handful of accepts, a join of 100 keys), so it cannot rot: every
//! decision reaches every peer through the delay line, which delays it and
//! counts it, and the namespaces are gone afterwards. Lower bounds only:
//! a loaded machine makes everything slower, never faster than the wire.
//! Root only (namespaces, TUN devices), as CI runs.

use std::time::Duration;

use keysync_bench::wan::{run_config, Config, WanSettings};

/// The namespaces this process made that still exist.
fn our_namespaces() -> Vec<String> {
    let prefix = format!("ksb-{}-", std::process::id());
    std::fs::read_dir("/var/run/netns")
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn three_masters_at_10_ms_get_every_accept_through_the_delay_line() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the WAN benchmark makes network namespaces and TUN devices: run this test as root (CI does)"
    );
    let settings = WanSettings {
        masters: vec![3],
        rtts: vec![Duration::from_millis(10)],
        losses_pct: vec![0.0],
        decisions: 6,
        pace: Duration::from_millis(100),
        seed: 200,
        joins: vec![100],
        ..WanSettings::full()
    };
    let config = Config { masters: 3, rtt: Duration::from_millis(10), loss_pct: 0.0 };
    let keys = keysync_bench::cluster::key_pool(8);
    let row = run_config(&settings, &config, &keys).expect("the configuration runs");
    println!("{row:#?}");

    let live = row.live.as_ref().expect("live figures");
    assert_eq!(live.latency.n_samples, 6 * 2, "one sample per accept and peer");
    assert_eq!(live.latency.n_missed, 0, "every accept reached every peer: {live:?}");
    // The accept crossed the delay line at least once: one one-way delay.
    assert!(live.latency.p50_ms >= 5.0, "p50 below the one-way delay of 5 ms: the delay line did not delay: {live:?}");
    assert_eq!(live.links_silent, 0, "the delay line counted packets on every link: {live:?}");
    assert!(live.bytes_per_decision > 0.0, "{live:?}");
    assert!(
        live.pushes_per_decision + live.fetches_per_decision >= 2.0,
        "each of the two peers received each decision at least once: {live:?}"
    );
    assert!(live.peak_rss_mib > 1.0, "{live:?}");

    let join = &row.joins[0];
    assert_eq!(join.keys, 100);
    assert!(join.first_key_ms >= 5.0, "the first key crossed the delay line: {join:?}");
    assert!(join.bytes_received_ratio >= 1.0, "the joiner received at least the key material: {join:?}");
    assert!(our_namespaces().is_empty(), "namespaces left behind: {:?}", our_namespaces());
}
