//! The key folders as mounts of their own, as the old packaged unit made
//! them (`ReadWritePaths=` on each): a rename from the agent's staging folder
//! into `minions/` fails with EXDEV, and staging beside the keys would put
//! the agent's files in folders other tools watch (issue 18). The agent
//! refuses to start, naming the folders and the fix, and `check` says the
//! same; with pki_dir one mount (the unit's layout now), it replicates.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use keysync_tests::binary::FaultCluster;
use keysync_tests::salt_ops::FOLDERS;
use keysync_tests::wait_until;

use crate::common::{converged, count, key_pool, write_pending};

/// `mount --bind DIR DIR` over each folder, unmounted on drop.
struct BindMounts(Vec<PathBuf>);

impl BindMounts {
    fn over(dirs: Vec<PathBuf>) -> BindMounts {
        let mut mounted = BindMounts(Vec::new());
        for dir in dirs {
            let out = Command::new("mount").arg("--bind").arg(&dir).arg(&dir).output().expect("run mount");
            assert!(
                out.status.success(),
                "this test bind-mounts the key folders and needs root (CAP_SYS_ADMIN), as the CI container has; \
                 `mount --bind {0} {0}` said: {1}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            mounted.0.push(dir);
        }
        mounted
    }
}

impl Drop for BindMounts {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = Command::new("umount").arg("-l").arg(dir).status();
        }
    }
}

fn staging_files(pki: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for dir in FOLDERS.iter().map(|f| pki.join(f)).chain([pki.join(".keysync-staging")]) {
        for dirent in std::fs::read_dir(&dir).unwrap() {
            let name = dirent.unwrap().file_name().to_string_lossy().to_string();
            if name.starts_with(".keysync-") {
                found.push(format!("{}/{name}", dir.display()));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_folders_that_are_mounts_of_their_own_are_refused_and_one_mount_replicates() {
    let _serial = crate::common::SERIAL.lock().await;
    const N: usize = 20;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(4);
    let ids: Vec<String> = (0..N).map(|i| format!("bound{i:02}")).collect();
    let mut cluster = FaultCluster::create(root.path(), 3, |idx, f| {
        // Pending on B too, as on a multi-master site.
        if idx < 2 {
            write_pending(&f.pki, ids.iter().cloned(), &keys);
        }
    })
    .await;
    let b = cluster.files[1].pki.clone();
    {
        let _mounts = BindMounts::over(FOLDERS.iter().map(|f| b.join(f)).collect());
        let (code, log) = cluster.start_refused(1).await;
        // EX_CONFIG: a set-up only the operator can fix, not restarted by the unit.
        assert_eq!(code, Some(78), "{log}");
        assert!(log.contains("is a mount of its own") && log.contains("one mount"), "{log}");
        let check =
            keysync_tests::binary::run_cli(&["check", "--config", cluster.files[1].config_path.to_str().unwrap()]);
        let said = String::from_utf8_lossy(&check.stdout);
        assert!(!check.status.success() && said.contains("FAIL") && said.contains("is a mount of its own"), "{said}");
        assert_eq!(staging_files(&b), Vec::<String>::new(), "nothing staged anywhere");
    }
    // pki_dir itself one mount, key folders and staging on it: as the unit makes it now.
    let _mount = BindMounts::over(vec![b.clone()]);
    cluster.start_all().await;
    let a = cluster.files[0].pki.clone();
    for id in &ids {
        std::fs::rename(a.join("minions_pre").join(id), a.join("minions").join(id)).unwrap();
    }
    wait_until(Duration::from_secs(60), "every key accepted on master-b", || count(&b, "minions") == N).await;
    for id in &ids[..5] {
        std::fs::rename(a.join("minions").join(id), a.join("minions_rejected").join(id)).unwrap();
    }
    wait_until(Duration::from_secs(60), "five rejected on master-b", || count(&b, "minions_rejected") == 5).await;
    converged(&cluster, Duration::from_secs(30)).await;
    for id in &ids {
        let folder = if ids[..5].contains(id) { "minions_rejected" } else { "minions" };
        assert_eq!(std::fs::read(b.join(folder).join(id)).unwrap(), std::fs::read(a.join(folder).join(id)).unwrap());
    }
    assert_eq!(staging_files(&b), Vec::<String>::new(), "no staging file left behind");
    assert_eq!(count(&b, "minions_pre"), 0, "B's pending copies are gone");
    cluster.stop_all();
}
