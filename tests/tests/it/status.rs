//! `salt-keysync status` (the real binary) against running agents: link
//! state of a stopped peer, key counts, every agent's version, a stopped
//! agent's message, and master.pub / settings drift between masters — also
//! as metrics.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use keysync_proto::PROTOCOL_VERSION;
use keysync_tests::binary::{free_addr, run_cli, ProcessCluster};
use keysync_tests::cluster::TestCluster;
use keysync_tests::probe::{metrics_text, write_private};
use keysync_tests::salt_ops::{delete_key, master_writes_pending, move_key, new_public_key, path, SaltLine};
use keysync_tests::wait_until;
use salt_keysync::cli::cluster::ClusterReport;
use salt_keysync::ops::board::{LinkState, StatusReport};

const WAIT: Duration = Duration::from_secs(20);

/// The agents' version: the workspace's, as the packages carry it.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Runs `salt-keysync status --json` for the agent of `config`.
async fn status(config: &Path) -> Result<StatusReport, String> {
    let config = config.to_str().unwrap().to_string();
    let out = tokio::task::spawn_blocking(move || run_cli(&["status", "--config", &config, "--json"])).await.unwrap();
    if !matches!(out.status.code(), Some(0 | 3)) {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let report: StatusReport = serde_json::from_slice(&out.stdout).expect("status --json prints one JSON report");
    // Issue 28 item 2: 3 exactly when a finding is an error (a master key mismatch below).
    let errors = report.findings.iter().any(|f| f.level == salt_keysync::ops::findings::Level::Error);
    assert_eq!(out.status.code(), Some(if errors { 3 } else { 0 }), "{:#?}", report.findings);
    Ok(report)
}

/// Waits until the status of the agent of `config` satisfies `check`.
async fn status_until(config: &Path, what: &str, check: impl Fn(&StatusReport) -> bool) -> StatusReport {
    let start = std::time::Instant::now();
    loop {
        let last = match status(config).await {
            Ok(report) if check(&report) => return report,
            Ok(report) => format!("{report:#?}"),
            Err(e) => e,
        };
        assert!(start.elapsed() < WAIT, "not true after {WAIT:?}: {what}; last status: {last}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn peer<'a>(report: &'a StatusReport, name: &str) -> &'a salt_keysync::ops::board::PeerStatus {
    report.peers.iter().find(|p| p.name == name).unwrap_or_else(|| panic!("{name} missing from {report:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_a_stopped_peer_down_and_counts_keys() {
    let mut cluster = TestCluster::start(3).await;
    let config_a = cluster.agents[0].files.config_path.clone();
    let key = new_public_key();
    master_writes_pending(cluster.pki(0), "web01", &key);
    master_writes_pending(cluster.pki(0), "web02", &key);
    move_key(SaltLine::S3008, cluster.pki(0), "web01", "minions");

    let report = status_until(&config_a, "both peers up and web01 accepted", |r| {
        r.peers.iter().all(|p| p.state == LinkState::Up) && r.keys.accepted == 1
    })
    .await;
    assert_eq!(report.node, "master-a");
    assert_eq!((report.version.as_str(), report.protocol_version), (VERSION, Some(PROTOCOL_VERSION)));
    for name in ["master-b", "master-c"] {
        let told = peer(&report, name).health.as_ref().and_then(|h| h.agent_version.as_deref());
        assert_eq!(told, Some(VERSION), "{name}'s Hello names its agent's version");
    }
    assert!(report.findings.iter().all(|f| f.kind != "agent-version"), "one version: {:?}", report.findings);
    assert_eq!(report.keys.pending, 1, "{report:?}");
    assert_eq!(report.keys.rejected, 0);
    assert!(peer(&report, "master-b").last_contact.is_some());

    cluster.stop(2).await;
    let report = status_until(&config_a, "master-c reported down", |r| {
        peer(r, "master-c").state == LinkState::Down && peer(r, "master-b").state == LinkState::Up
    })
    .await;
    let c = peer(&report, "master-c");
    assert!(c.last_error.is_some(), "a down peer carries its last error: {c:?}");

    // The table says the same.
    let config = config_a.to_str().unwrap().to_string();
    let out = tokio::task::spawn_blocking(move || run_cli(&["status", "--config", &config])).await.unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(table.lines().any(|l| l.starts_with("master-c") && l.contains(" down ")), "{table}");
    assert!(table.contains("1 accepted, 0 rejected, 1 pending, 0 deleted"), "{table}");
    assert!(table.contains(&format!("(salt-keysync {VERSION}, protocol {PROTOCOL_VERSION}, started")), "{table}");
    assert!(table.lines().any(|l| l.starts_with("master-b") && l.trim_end().ends_with(VERSION)), "{table}");

    // status --cluster: every master's agent version (master-c's as it last
    // reported it), and this agent's protocol.
    let config = config_a.to_str().unwrap().to_string();
    let out = tokio::task::spawn_blocking(move || run_cli(&["status", "--config", &config, "--cluster", "--json"]))
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let site: ClusterReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((site.version.as_str(), site.protocol_version), (VERSION, Some(PROTOCOL_VERSION)));
    let versions: Vec<(&str, Option<&str>)> =
        site.masters.iter().map(|m| (m.name.as_str(), m.agent_version.as_deref())).collect();
    assert_eq!(versions, [("master-a", Some(VERSION)), ("master-b", Some(VERSION)), ("master-c", Some(VERSION))]);

    // The stopped agent: one clear line, non-zero exit, no panic.
    let config_c = cluster.agents[2].files.config_path.to_str().unwrap().to_string();
    let out = tokio::task::spawn_blocking(move || run_cli(&["status", "--config", &config_c])).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("salt-keysync: the agent is not running (no control socket at"), "{stderr}");
    assert!(stderr.contains("systemctl start salt-keysync"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    cluster.shutdown().await;
}

#[test]
fn control_socket_is_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cluster = TestCluster::start(1).await;
        let socket = cluster.agents[0].files.dir.join("state/control.sock");
        wait_until(WAIT, "control socket exists", || socket.exists()).await;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&socket), 0o600);
        assert_eq!(mode(socket.parent().unwrap()), 0o700);
        cluster.shutdown().await;
        assert!(!socket.exists(), "the socket is removed at stop");
    });
}

/// master-a and master-b share master.pub; master-c has another. master-b
/// has another publisher_acl. Each difference is reported by status, as a
/// metric, once in the audit log, while decisions keep replicating.
#[test]
fn drifted_masters_are_reported_while_keys_replicate() {
    let dir = tempfile::tempdir().unwrap();
    let shared_pub = new_public_key();
    let other_pub = new_public_key();
    let metrics_addrs = Mutex::new(Vec::new());
    let key = new_public_key();
    let cluster = ProcessCluster::start(dir.path(), 3, |f| {
        let master_pub = if f.name == "master-c" { &other_pub } else { &shared_pub };
        write_private(&f.pki.join("master.pub"), master_pub);
        let acl = if f.name == "master-b" { "pkg.*" } else { "test.*" };
        write_private(
            &f.dir.join("salt-master.conf"),
            &format!("interface: 127.0.0.1\npublisher_acl:\n  fred:\n    - {acl}\nnodegroups:\n  web: 'L@web01'\n"),
        );
        let addr = free_addr();
        metrics_addrs.lock().unwrap().push((f.name.clone(), addr));
        let text = std::fs::read_to_string(&f.config_path).unwrap();
        write_private(&f.config_path, &format!("metrics_listen = \"{addr}\"\n{text}"));
        master_writes_pending(&f.pki, "web01", &key);
    });
    let metrics_addrs = metrics_addrs.into_inner().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        let config_a = &cluster.files[0].config_path;
        let report = status_until(config_a, "drift with master-b and master-c known", |r| {
            peer(r, "master-b").health.is_some() && peer(r, "master-c").health.is_some()
        })
        .await;
        let b = peer(&report, "master-b");
        let c = peer(&report, "master-c");
        assert!(!b.drift.master_pub_mismatch, "{b:?}");
        assert_eq!(b.drift.settings, vec!["publisher_acl".to_string()], "{b:?}");
        assert!(c.drift.master_pub_mismatch, "{c:?}");
        assert!(c.drift.settings.is_empty(), "{c:?}");

        let config = config_a.to_str().unwrap().to_string();
        let out = tokio::task::spawn_blocking(move || run_cli(&["status", "--config", &config])).await.unwrap();
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(table.contains("master-c: MASTER KEY MISMATCH"), "{table}");
        assert!(table.contains("master-b: SETTINGS DRIFT: publisher_acl"), "{table}");

        let metrics = metrics_text(metrics_addrs[0].1);
        for want in [
            "keysync_master_key_mismatch{peer=\"master-c\"} 1",
            "keysync_master_key_mismatch{peer=\"master-b\"} 0",
            "keysync_settings_drift{peer=\"master-b\",setting=\"publisher_acl\"} 1",
            "keysync_settings_drift{peer=\"master-b\",setting=\"nodegroups\"} 0",
            "keysync_settings_drift{peer=\"master-c\",setting=\"publisher_acl\"} 0",
        ] {
            assert!(metrics.contains(want), "{want:?} missing from:\n{metrics}");
        }

        // Key decisions keep replicating to the drifted masters.
        move_key(SaltLine::S3008, &cluster.files[0].pki, "web01", "minions");
        for f in &cluster.files[1..] {
            wait_until(WAIT, "accept reaches a drifted master", || {
                std::fs::read(path(&f.pki, "minions", "web01")).is_ok_and(|bytes| bytes == key.as_bytes())
            })
            .await;
        }
        // Several Hellos later (1 s anti-entropy in tests), still one record per detection.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let audit = std::fs::read_to_string(&cluster.files[0].audit_log).unwrap();
        let count = |needle: &str| audit.lines().filter(|l| l.contains(needle)).count();
        assert_eq!(count("\"action\":\"master-key\""), 1, "{audit}");
        assert_eq!(count("\"action\":\"settings\""), 1, "{audit}");
        let log = std::fs::read_to_string(cluster.files[0].dir.join("agent.log")).unwrap();
        assert!(log.contains("ERROR") && log.contains("master.pub differs"), "{log}");
    });
    cluster.stop();
}

#[test]
fn metrics_serve_the_counters_after_a_replicated_accept() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_public_key();
    let metrics_addrs = Mutex::new(Vec::new());
    let cluster = ProcessCluster::start(dir.path(), 3, |f| {
        master_writes_pending(&f.pki, "web01", &key);
        // Opt-in: master-c has no metrics listener.
        if f.name != "master-c" {
            let addr = free_addr();
            metrics_addrs.lock().unwrap().push(addr);
            let text = std::fs::read_to_string(&f.config_path).unwrap();
            write_private(&f.config_path, &format!("metrics_listen = \"{addr}\"\n{text}"));
        }
    });
    let addrs = metrics_addrs.into_inner().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        let (a, b) = (addrs[0], addrs[1]);
        // Links come up in whatever order the agents started; wait for all of them.
        wait_until(WAIT, "every link of master-a and master-b up", || {
            let (text_a, text_b) = (metrics_text(a), metrics_text(b));
            ["master-b", "master-c"].iter().all(|p| text_a.contains(&format!("keysync_peer_up{{peer=\"{p}\"}} 1\n")))
                && ["master-a", "master-c"]
                    .iter()
                    .all(|p| text_b.contains(&format!("keysync_peer_up{{peer=\"{p}\"}} 1\n")))
        })
        .await;
        move_key(SaltLine::S3008, &cluster.files[0].pki, "web01", "minions");
        wait_until(WAIT, "master-b counts the applied accept", || {
            metrics_text(b).contains("keysync_decisions_applied_total 1\n")
        })
        .await;
        let text = metrics_text(b);
        for want in [
            "keysync_propagation_latency_seconds_count 1\n",
            "keysync_decisions_refused_total 0\n",
            "keysync_decisions_conflicted_total 0\n",
            "keysync_anti_entropy_runs_total{peer=\"master-a\"}",
            "keysync_anti_entropy_bytes_total{peer=\"master-a\",direction=\"sent\"}",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        // The origin applied nothing from peers.
        assert!(metrics_text(a).contains("keysync_decisions_applied_total 0\n"));
        let log_c = std::fs::read_to_string(cluster.files[2].dir.join("agent.log")).unwrap();
        assert!(!log_c.contains("Prometheus"), "master-c serves no metrics:\n{log_c}");
    });
    cluster.stop();
}

/// `keysync_held_deletes{origin}` (what the SaltKeysyncDeletesHeld alert
/// reads) follows what the guard holds: a peer's mass delete counted for
/// its origin while every key stays here, back to 0 once released.
#[test]
fn metrics_count_a_peers_held_deletes_until_they_are_released() {
    const N: usize = 60; // past the guard's default max_deletes (50)
    let ids: Vec<String> = (0..N).map(|i| format!("web{i:02}")).collect();
    let dir = tempfile::tempdir().unwrap();
    let key = new_public_key();
    let metrics_addrs = Mutex::new(Vec::new());
    let cluster = ProcessCluster::start(dir.path(), 2, |f| {
        // Both masters accepted the same keys before their agents' first start.
        for id in &ids {
            master_writes_pending(&f.pki, id, &key);
            move_key(SaltLine::S3006, &f.pki, id, "minions");
        }
        let addr = free_addr();
        metrics_addrs.lock().unwrap().push(addr);
        let text = std::fs::read_to_string(&f.config_path).unwrap();
        write_private(&f.config_path, &format!("metrics_listen = \"{addr}\"\n{text}"));
    });
    let addrs = metrics_addrs.into_inner().unwrap();
    let (a, b) = (addrs[0], addrs[1]);
    let gauge = |text: &str| -> Option<usize> {
        let line = text.lines().find(|l| l.starts_with("keysync_held_deletes{origin=\"master-a\"} "))?;
        line.rsplit(' ').next()?.parse().ok()
    };
    let pki_b = cluster.files[1].pki.clone();
    let kept_on_b = || ids.iter().filter(|id| path(&pki_b, "minions", id).exists()).count();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        wait_until(WAIT, "both links up", || {
            metrics_text(a).contains("keysync_peer_up{peer=\"master-b\"} 1\n")
                && metrics_text(b).contains("keysync_peer_up{peer=\"master-a\"} 1\n")
        })
        .await;
        assert_eq!(gauge(&metrics_text(b)), Some(0), "0 for a configured peer before anything is held");
        for id in &ids {
            delete_key(&cluster.files[0].pki, id);
        }
        // Held, the gauge counting exactly the keys master-b still has.
        wait_until(WAIT, "master-b's gauge counts the held deletes", || {
            let kept = kept_on_b();
            kept > 0 && gauge(&metrics_text(b)) == Some(kept)
        })
        .await;
        let config_b = cluster.files[1].config_path.to_string_lossy().into_owned();
        let out =
            tokio::task::spawn_blocking(move || run_cli(&["release", "-y", "--config", &config_b])).await.unwrap();
        assert!(out.status.success(), "release: {}", String::from_utf8_lossy(&out.stderr));
        wait_until(WAIT, "released: deleted on master-b, the gauge back to 0", || {
            kept_on_b() == 0 && gauge(&metrics_text(b)) == Some(0)
        })
        .await;
    });
    cluster.stop();
}
