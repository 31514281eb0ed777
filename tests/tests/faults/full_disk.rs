//! A full disk while applying: master-b's pki_dir is a real 1 MiB tmpfs
//! (mounting needs root, which the CI container has). The agent retries with
//! backoff, audits the trouble once, counts every failed attempt in
//! `keysync_write_failures_total`, records nothing that is not on disk, and
//! catches up when space returns — also across a kill -9 while full. An
//! audit log on a full disk: replication goes on, the failures are counted,
//! and a `lost` record tells how many records are missing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use keysync_tests::binary::{free_addr, FaultCluster};
use keysync_tests::probe::{metrics_text, write_private};
use keysync_tests::salt_ops::FOLDERS;
use keysync_tests::wait_until;

use crate::common::{assert_no_decision, audited, converged, count, key_pool, with_metrics, write_pending};

/// A size-limited tmpfs mounted over a folder, unmounted on drop.
struct SmallDisk {
    at: PathBuf,
}

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> SmallDisk {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "the full-disk test mounts a small tmpfs and needs root (CAP_SYS_ADMIN): run the tests as root, \
             as the CI container does; `mount -t tmpfs -o size=1m tmpfs {}` said: {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { at: at.to_path_buf() }
    }

    /// Fills the file system with `filler` until it refuses another byte.
    fn fill(&self) {
        let mut file = std::fs::File::create(self.at.join(".filler")).unwrap();
        let chunk = vec![0u8; 4096];
        loop {
            match file.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc_enospc()) => break,
                Err(e) => panic!("filling {}: {e}", self.at.display()),
            }
        }
    }

    fn free(&self) {
        std::fs::remove_file(self.at.join(".filler")).unwrap();
    }
}

fn libc_enospc() -> i32 {
    28
}

/// The value of an unlabelled counter in a metrics text (0 if absent).
fn counter(text: &str, name: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_retried_audited_once_and_caught_up() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(8);
    let ids: Vec<String> = (0..40).map(|i| format!("full{i:02}")).collect();
    let metrics_b = free_addr();
    let mut cluster = FaultCluster::create(root.path(), 3, |idx, f| {
        if idx == 0 {
            write_pending(&f.pki, ids.iter().cloned(), &keys);
        }
        if idx == 1 {
            with_metrics(f, metrics_b);
        }
    })
    .await;
    let b = cluster.files[1].pki.clone();
    let disk = SmallDisk::mount(&b, "1m");
    for folder in FOLDERS {
        std::fs::create_dir_all(b.join(folder)).unwrap();
    }
    cluster.start_all().await;
    let a = cluster.files[0].pki.clone();
    let accept = |range: std::ops::Range<usize>| {
        for id in &ids[range] {
            std::fs::rename(a.join("minions_pre").join(id), a.join("minions").join(id)).unwrap();
        }
    };

    // Full while 20 accepts arrive: nothing is written, one failure audited.
    disk.fill();
    accept(0..20);
    wait_until(Duration::from_secs(30), "master-b audits the failed write", || {
        !audited(&cluster, 1, "write", "failed").is_empty()
    })
    .await;
    wait_until(Duration::from_secs(30), "master-c has the accepts", || count(&cluster.files[2].pki, "minions") == 20)
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await; // several retries with backoff
    assert_eq!(count(&b, "minions"), 0);
    assert_eq!(audited(&cluster, 1, "write", "failed").len(), 1, "one audit record per episode, not per retry");
    let failures = counter(&metrics_text(metrics_b), "keysync_write_failures_total");
    assert!(failures >= 2, "every failed attempt is counted, retries included: {failures}");

    disk.free();
    wait_until(Duration::from_secs(30), "master-b catches up", || count(&b, "minions") == 20).await;
    wait_until(Duration::from_secs(10), "the recovery is audited", || {
        audited(&cluster, 1, "write", "recovered").len() == 1
    })
    .await;

    // Full again, and killed while full: nothing recorded without its file,
    // so the restart finds no "missing" key to turn into a delete.
    disk.fill();
    accept(20..40);
    wait_until(Duration::from_secs(30), "master-b fails again", || audited(&cluster, 1, "write", "failed").len() == 2)
        .await;
    cluster.kill9(1);
    disk.free();
    cluster.start(1).await;
    converged(&cluster, Duration::from_secs(60)).await;
    for f in &cluster.files {
        assert_eq!(count(&f.pki, "minions"), 40, "{}", f.name);
    }
    assert_no_decision(&cluster, &["delete", "reject"]);
    cluster.stop_all();
    drop(disk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audit_log_on_a_full_disk_is_counted_and_its_gap_recorded() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(4);
    // More records than the free end of the log's last page holds (tmpfs
    // appends there without a new page even when the disk is full).
    let ids: Vec<String> = (0..31).map(|i| format!("gap{i:02}")).collect();
    let metrics_b = free_addr();
    let audit_dir = root.path().join("master-b-audit");
    let mut cluster = FaultCluster::create(root.path(), 2, |idx, f| {
        if idx == 0 {
            write_pending(&f.pki, ids.iter().cloned(), &keys);
        }
        if idx == 1 {
            with_metrics(f, metrics_b);
            let text = std::fs::read_to_string(&f.config_path).unwrap();
            let audit_log = audit_dir.join("audit.jsonl");
            write_private(&f.config_path, &format!("audit_log = \"{}\"\n{text}", audit_log.display()));
        }
    })
    .await;
    std::fs::create_dir(&audit_dir).unwrap();
    let disk = SmallDisk::mount(&audit_dir, "1m");
    cluster.files[1].audit_log = audit_dir.join("audit.jsonl");
    cluster.start_all().await;
    let (a, b) = (cluster.files[0].pki.clone(), cluster.files[1].pki.clone());
    let accept = |id: &String| std::fs::rename(a.join("minions_pre").join(id), a.join("minions").join(id)).unwrap();

    disk.fill();
    for id in &ids[..30] {
        accept(id);
    }
    wait_until(Duration::from_secs(30), "master-b applies the accepts without its audit log", || {
        count(&b, "minions") == 30
    })
    .await;
    wait_until(Duration::from_secs(30), "the audit failures are counted", || {
        counter(&metrics_text(metrics_b), "keysync_audit_write_failures_total") > 0
    })
    .await;

    disk.free();
    accept(&ids[30]);
    wait_until(Duration::from_secs(30), "master-b records how many audit records were lost", || {
        !audited(&cluster, 1, "lost", "failed").is_empty()
    })
    .await;
    let lost = &audited(&cluster, 1, "lost", "failed")[0];
    assert!(lost.reason.as_deref().is_some_and(|r| r.contains("audit records could not be written")), "{lost:?}");
    cluster.stop_all();
    drop(disk);
}

/// Issue 29 item 2: master-b's state folder (its redb store, and here its
/// audit log) on a full disk. redb refuses every transaction after an I/O
/// error until the database is reopened: the agent stayed stuck (637 of
/// 1,000 keys missing five minutes after space came back) until restarted.
/// Now it reopens the store and catches up by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_state_disk_heals_without_a_restart() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(8);
    let ids: Vec<String> = (0..200).map(|i| format!("state{i:03}")).collect();
    let mut cluster = FaultCluster::create(root.path(), 3, |idx, f| {
        if idx == 0 {
            write_pending(&f.pki, ids.iter().cloned(), &keys);
        }
    })
    .await;
    let state_b = cluster.files[1].dir.join("state");
    std::fs::create_dir_all(&state_b).unwrap();
    let disk = SmallDisk::mount(&state_b, "4m");
    cluster.start_all().await;
    let a = cluster.files[0].pki.clone();
    let b = cluster.files[1].pki.clone();

    disk.fill();
    for id in &ids {
        std::fs::rename(a.join("minions_pre").join(id), a.join("minions").join(id)).unwrap();
    }
    wait_until(Duration::from_secs(30), "master-c has the accepts", || count(&cluster.files[2].pki, "minions") == 200)
        .await;
    // Writes fail on master-b meanwhile (its store cannot commit), and its
    // status says so.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(count(&b, "minions") < 200, "master-b could not have recorded them all with its state disk full");
    let config = cluster.files[1].config_path.to_str().unwrap().to_string();
    let out = keysync_tests::binary::run_cli(&["status", "--json", "--config", &config]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let trouble = report["write_trouble"].as_str().unwrap_or_default().to_string();
    assert!(trouble.starts_with("writes failing for ") && trouble.contains("state store"), "{report}");

    disk.free();
    wait_until(Duration::from_secs(60), "master-b catches up without a restart", || count(&b, "minions") == 200).await;
    let log = std::fs::read_to_string(cluster.log(1)).unwrap_or_default();
    assert!(log.contains("state store reopened after an I/O error"), "the store was reopened, not the agent restarted");
    assert_no_decision(&cluster, &["delete", "reject"]);
    cluster.stop_all();
    drop(disk);
}
