//! Real `salt-key` (Salt 3008.3, 3007.15 and 3006.28 from PyPI) on one of three pki
//! folders, three agent processes: every decision shows up, byte for byte,
//! on the other two masters; and a first-contact conflict (two keys accepted
//! for one id before the agents existed) is settled by one live `salt-key -d`
//! (issue 16). The venvs come from `tests/salt/venv.sh`, which the test
//! command runs first; a missing venv is a failure, never a skip.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use keysync_tests::binary::ProcessCluster;
use keysync_tests::cluster::AgentFiles;
use keysync_tests::salt_ops::{master_writes_pending, new_public_key, path, FOLDERS};
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

/// The ids `status` on this master lists as unresolved conflicts.
fn conflicts(files: &AgentFiles) -> Vec<String> {
    let report = salt_keysync::cli::status::query(&files.dir.join("state/control.sock")).expect("status answers");
    report.conflicts.into_iter().map(|c| c.minion).collect()
}

/// Issue 16: master-a and master-b held different keys accepted for web01
/// before their agents first started (master-c held nothing): a conflict no
/// rule settles, so each keeps its own, master-c trusts neither, each master
/// audits it once with both fingerprints and `status` lists it. One live
/// `salt-key -d web01` on master `deleting` settles it: web01 leaves every
/// master and every `status`. The minion's key, sent again and accepted
/// with `salt-key -a` on master-c, then reaches every master as usual.
fn a_first_contact_conflict_is_settled_by_one_live_delete(version: &str, deleting: usize) {
    let salt_key_bin = salt_key_bin(version);
    let dir = tempfile::tempdir().unwrap();
    let (key_a, key_b) = (new_public_key(), new_public_key());
    let cluster = ProcessCluster::start(dir.path(), 3, |f| {
        let key = match f.name.as_str() {
            "master-a" => &key_a,
            "master-b" => &key_b,
            _ => return,
        };
        std::fs::write(path(&f.pki, "minions", "web01"), key).unwrap();
        std::fs::set_permissions(path(&f.pki, "minions", "web01"), std::fs::Permissions::from_mode(0o644)).unwrap();
    });
    let files = &cluster.files;
    let confs: Vec<PathBuf> = files.iter().map(salt_config).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        for f in files {
            let what = format!("status on {} lists web01 as a conflict", f.name);
            wait_until(Duration::from_secs(20), &what, || conflicts(f) == ["web01"]).await;
        }
        all_hold(&files[..1], "web01", Some(("minions", key_a.as_bytes()))).await;
        all_hold(&files[1..2], "web01", Some(("minions", key_b.as_bytes()))).await;
        all_hold(&files[2..], "web01", None).await;
        let fingerprints = |key: &str| salt_keysync::core::Fingerprint::of(key.as_bytes()).to_string();
        let both = [fingerprints(&key_a), fingerprints(&key_b)];
        for f in files {
            let audit = salt_keysync::disk::audit::read_all(&f.audit_log).unwrap();
            let told: Vec<_> =
                audit.iter().filter(|r| r.action == "conflict" && r.minion.as_deref() == Some("web01")).collect();
            assert_eq!(told.len(), 1, "{}: the conflict audited once: {told:?}", f.name);
            let mut keys = [told[0].fingerprint.clone().unwrap(), told[0].other_fingerprint.clone().unwrap()];
            keys.sort();
            let mut want = both.clone();
            want.sort();
            assert_eq!(keys, want, "{}: with both fingerprints", f.name);
        }

        salt_key(&salt_key_bin, &confs[deleting], &["-d", "web01"]);
        all_hold(files, "web01", None).await;
        for f in files {
            let what = format!("status on {} lists no conflict", f.name);
            wait_until(Duration::from_secs(20), &what, || conflicts(f).is_empty()).await;
        }

        master_writes_pending(&files[2].pki, "web01", &key_b);
        salt_key(&salt_key_bin, &confs[2], &["-a", "web01"]);
        all_hold(files, "web01", Some(("minions", key_b.as_bytes()))).await;
        assert!(files.iter().all(|f| conflicts(f).is_empty()), "no conflict after the accept");
    });
    cluster.stop();
}

#[test]
fn salt_3008_first_contact_conflict_settled_by_one_salt_key_delete() {
    a_first_contact_conflict_is_settled_by_one_live_delete("3008.3", 0);
}

#[test]
fn salt_3006_first_contact_conflict_settled_by_one_salt_key_delete() {
    a_first_contact_conflict_is_settled_by_one_live_delete("3006.28", 1);
}
