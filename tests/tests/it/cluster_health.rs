//! `salt-keysync status --cluster` on three agent processes beside real
//! Salt installations (3008.3 on master-a and master-c, 3006.28 on
//! master-b): every master's Salt version and key counts, the version skew,
//! and a master switched to `auto_accept: True` shown as an error on every
//! master, audited once, as a metric, and cleared when switched back.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use keysync_tests::binary::{free_addr, run_cli, ProcessCluster};
use keysync_tests::probe::{metrics_text, write_private};
use keysync_tests::salt;
use keysync_tests::salt_ops::{master_writes_pending, move_key, new_public_key, SaltLine};
use salt_keysync::cli::cluster::ClusterReport;
use salt_keysync::disk::audit::read_all;
use salt_keysync::ops::findings::Level;

const WAIT: Duration = Duration::from_secs(30);

async fn cluster_report(config: &Path) -> Result<ClusterReport, String> {
    let config = config.to_str().unwrap().to_string();
    let out = tokio::task::spawn_blocking(move || run_cli(&["status", "--cluster", "--json", "--config", &config]))
        .await
        .unwrap();
    if !matches!(out.status.code(), Some(0 | 3)) {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let report: ClusterReport =
        serde_json::from_slice(&out.stdout).expect("status --cluster --json prints one JSON object");
    // Issue 28 item 2: 3 exactly when a finding is an error (the auto-accepting master below).
    let errors = report.findings.iter().any(|f| f.level == Level::Error);
    assert_eq!(out.status.code(), Some(if errors { 3 } else { 0 }), "{:#?}", report.findings);
    Ok(report)
}

/// Waits until the cluster report of the agent of `config` satisfies `check`.
async fn report_until(config: &Path, what: &str, check: impl Fn(&ClusterReport) -> bool) -> ClusterReport {
    let start = std::time::Instant::now();
    loop {
        let last = match cluster_report(config).await {
            Ok(report) if check(&report) => return report,
            Ok(report) => format!("{report:#?}"),
            Err(e) => e,
        };
        assert!(start.elapsed() < WAIT, "not true after {WAIT:?}: {what}; last report: {last}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn auto_accepting(report: &ClusterReport) -> Vec<String> {
    report.findings.iter().filter(|f| f.kind == "auto-accept").flat_map(|f| f.masters.clone()).collect()
}

fn auto_accept_records(audit_log: &Path) -> Vec<(String, Option<String>)> {
    read_all(audit_log)
        .unwrap()
        .into_iter()
        .filter(|r| r.action == "auto-accept")
        .map(|r| (r.outcome, r.origin))
        .collect()
}

#[test]
fn an_auto_accepting_master_is_an_error_on_every_master() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_public_key();
    let metrics_addrs = Mutex::new(Vec::new());
    let cluster = ProcessCluster::start(dir.path(), 3, |f| {
        let version = if f.name == "master-b" { "3006.28" } else { "3008.3" };
        let salt_master = salt::tool(version, "salt-master");
        let addr = free_addr();
        metrics_addrs.lock().unwrap().push(addr);
        let text = std::fs::read_to_string(&f.config_path).unwrap().replace(
            "[salt]\n",
            &format!("[salt]\nversion_command = [\"{}\", \"--version\"]\n", salt_master.display()),
        );
        write_private(&f.config_path, &format!("metrics_listen = \"{addr}\"\n{text}"));
        write_private(&f.dir.join("salt-master.conf"), "interface: 127.0.0.1\nauto_accept: False\n");
        master_writes_pending(&f.pki, "web01", &key);
    });
    let metrics_a = metrics_addrs.into_inner().unwrap()[0];
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        let config = |idx: usize| cluster.files[idx].config_path.clone();
        move_key(SaltLine::S3008, &cluster.files[0].pki, "web01", "minions");

        // Versions and key counts of every master, and the skew.
        let report = report_until(&config(0), "every master's version and web01 accepted on master-b", |r| {
            r.masters.iter().all(|m| m.salt_version.is_some())
                && r.masters[1].keys.as_ref().is_some_and(|k| k.accepted == 1)
        })
        .await;
        let names: Vec<&str> = report.masters.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["master-a", "master-b", "master-c"]);
        let versions: Vec<&str> = report.masters.iter().map(|m| m.salt_version.as_deref().unwrap()).collect();
        assert_eq!(versions, ["3008.3", "3006.28", "3008.3"], "as `salt-master --version` of each venv says");
        assert!(report.masters[0].this && report.masters[1].link.is_some());
        let skew = report.findings.iter().find(|f| f.kind == "salt-version").expect("the skew is a finding");
        assert_eq!(skew.level, Level::Warning);
        assert_eq!(
            skew.message,
            "the masters run different Salt versions: 3006.28 on master-b; 3008.3 on master-a, master-c"
        );
        assert!(auto_accepting(&report).is_empty(), "{report:#?}");

        // master-b's operator turns on auto_accept in master.d/, as Salt reads it.
        std::fs::create_dir(cluster.files[1].dir.join("master.d")).unwrap();
        write_private(&cluster.files[1].dir.join("master.d/auto.conf"), "auto_accept: True\n");
        for idx in 0..3 {
            let report = report_until(&config(idx), "master-b auto-accepts, seen by every agent", |r| {
                auto_accepting(r) == ["master-b"]
            })
            .await;
            let finding = report.findings.iter().find(|f| f.kind == "auto-accept").unwrap();
            assert_eq!(finding.level, Level::Error);
            assert_eq!(report.findings[0], *finding, "errors come first");
            assert!(finding.message.contains("master-b accepts keys by itself (auto_accept: True)"), "{finding:?}");
        }
        let table = {
            let config = config(2).to_str().unwrap().to_string();
            let out = tokio::task::spawn_blocking(move || run_cli(&["status", "--cluster", "--config", &config]))
                .await
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("master-b ") && l.contains("3006.28") && l.contains("ERROR auto-accept")),
            "{table}"
        );
        assert!(table.contains("ERROR    master-b accepts keys by itself (auto_accept: True)"), "{table}");
        let text = metrics_text(metrics_a);
        assert!(text.contains("keysync_master_auto_accept{master=\"master-b\",setting=\"auto_accept\"} 1"), "{text}");
        assert!(text.contains("keysync_master_salt_info{master=\"master-b\",salt_version=\"3006.28\"} 1"), "{text}");

        // Several rounds later (1 s in tests): still one record per master.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let b = Some("master-b".to_string());
        for f in &cluster.files {
            assert_eq!(auto_accept_records(&f.audit_log), [("detected".to_string(), b.clone())], "{}", f.name);
        }

        std::fs::remove_file(cluster.files[1].dir.join("master.d/auto.conf")).unwrap();
        report_until(&config(0), "master-b no longer auto-accepts", |r| auto_accepting(r).is_empty()).await;
        wait_until_resolved(&cluster.files[0].audit_log).await;
        assert!(metrics_text(metrics_a)
            .contains("keysync_master_auto_accept{master=\"master-b\",setting=\"auto_accept\"} 0"));
    });
    cluster.stop();
}

async fn wait_until_resolved(audit_log: &Path) {
    keysync_tests::wait_until(WAIT, "the end of the auto-acceptance is audited", || {
        auto_accept_records(audit_log).last().is_some_and(|(outcome, _)| outcome == "resolved")
    })
    .await;
}
