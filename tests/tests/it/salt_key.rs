//! Real `salt-key` (Salt 3008.3, 3007.15 and 3006.28 from PyPI) on one of three pki
//! folders, three agent processes: every decision shows up, byte for byte,
//! on the other two masters. The venvs come from `tests/salt/venv.sh`, which
//! the test command runs first; a missing venv is a failure, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use keysync_tests::binary::ProcessCluster;
use keysync_tests::cluster::AgentFiles;
use keysync_tests::salt_ops::{master_writes_pending, new_public_key, FOLDERS};
use keysync_tests::wait_until;

fn salt_key_bin(version: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).expect("target/<profile>/deps/<test>");
    let bin = target.join("salt-venvs").join(version).join("bin/salt-key");
    assert!(bin.exists(), "no Salt {version} venv at {}: run tests/salt/venv.sh {version}", bin.display());
    bin
}

/// A `salt-key -c DIR` config for a master whose files live under `files.dir`.
fn salt_config(files: &AgentFiles) -> PathBuf {
    let conf_dir = files.dir.join("salt");
    std::fs::create_dir_all(files.dir.join("sock")).unwrap();
    std::fs::create_dir_all(&conf_dir).unwrap();
    let dir = files.dir.display();
    std::fs::write(
        conf_dir.join("master"),
        format!(
            "root_dir: {dir}\npki_dir: {dir}/pki\ncachedir: {dir}/cache\nsock_dir: {dir}/sock\nuser: root\nlog_file: {dir}/salt.log\n"
        ),
    )
    .unwrap();
    conf_dir
}

fn salt_key(bin: &Path, conf: &Path, args: &[&str]) {
    let out = Command::new(bin).arg("-c").arg(conf).args(args).arg("-y").output().unwrap();
    assert!(out.status.success(), "salt-key {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

async fn all_hold(files: &[AgentFiles], id: &str, want: Option<(&str, &[u8])>) {
    for f in files {
        let what = format!("{id} on {} should be {:?}", f.name, want.map(|w| w.0));
        wait_until(Duration::from_secs(20), &what, || {
            let present: Vec<&str> = FOLDERS.iter().copied().filter(|d| f.pki.join(d).join(id).exists()).collect();
            match want {
                None => present.is_empty(),
                Some((folder, key)) => {
                    present == [folder] && std::fs::read(f.pki.join(folder).join(id)).unwrap() == key
                }
            }
        })
        .await;
    }
}

fn real_salt_key_decisions_replicate(version: &str) {
    let salt_key_bin = salt_key_bin(version);
    let dir = tempfile::tempdir().unwrap();
    let key = new_public_key();
    let cluster = ProcessCluster::start(dir.path(), 3, |f| master_writes_pending(&f.pki, "web01", &key));
    let files = &cluster.files;
    let confs: Vec<PathBuf> = files.iter().map(salt_config).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        salt_key(&salt_key_bin, &confs[0], &["-a", "web01"]);
        all_hold(files, "web01", Some(("minions", key.as_bytes()))).await;
        salt_key(&salt_key_bin, &confs[1], &["-r", "web01", "--include-accepted"]);
        all_hold(files, "web01", Some(("minions_rejected", key.as_bytes()))).await;
        // The replicated reject made masters a and c rotate their AES key too.
        for f in [&files[0], &files[2]] {
            let dfn = f.dir.join("cache/.dfn");
            wait_until(Duration::from_secs(5), ".dfn dropped", || dfn.exists()).await;
            assert_eq!(std::fs::read_to_string(&dfn).unwrap(), format!("{}_master", f.name));
            std::fs::remove_file(&dfn).unwrap();
        }
        salt_key(&salt_key_bin, &confs[2], &["-d", "web01"]);
        all_hold(files, "web01", None).await;
    });
    cluster.stop();
}

#[test]
fn salt_3008_salt_key_accept_reject_delete_replicate() {
    real_salt_key_decisions_replicate("3008.3");
}

#[test]
fn salt_3007_salt_key_accept_reject_delete_replicate() {
    real_salt_key_decisions_replicate("3007.15");
}

#[test]
fn salt_3006_salt_key_accept_reject_delete_replicate() {
    real_salt_key_decisions_replicate("3006.28");
}
