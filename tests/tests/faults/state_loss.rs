//! The state folder lost or corrupt on one master: the agent refuses to
//! start and names the recovery command; `recover --from-peers` rebuilds the
//! state without overriding the peers' decisions (a key deleted meanwhile
//! stays deleted, though the master's stale folder still held it).

use std::time::Duration;

use keysync_tests::binary::{run_cli, FaultCluster};
use keysync_tests::salt_ops::{delete_key, move_key, SaltLine};
use keysync_tests::wait_until;

use crate::common::{assert_winners_applied, converged, count, decided, key_pool, write_pending};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_or_corrupt_state_is_refused_and_rebuilt_from_the_peers() {
    let _serial = crate::common::SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let keys = key_pool(10);
    let ids: Vec<String> = (0..10).map(|i| format!("lost{i}")).collect();
    let mut cluster =
        FaultCluster::create(root.path(), 3, |_, f| write_pending(&f.pki, ids.iter().cloned(), &keys)).await;
    cluster.start_all().await;
    let (a, c) = (cluster.files[0].pki.clone(), cluster.files[2].pki.clone());
    for id in &ids[..5] {
        move_key(SaltLine::S3008, &a, id, "minions");
    }
    for id in &ids[5..7] {
        move_key(SaltLine::S3006, &a, id, "minions_rejected");
    }
    wait_until(Duration::from_secs(30), "decisions reach master-c", || count(&c, "minions") == 5).await;
    converged(&cluster, Duration::from_secs(30)).await;

    // master-c stops and loses its state folder; meanwhile master-a deletes
    // lost0, which master-c's folders still hold.
    cluster.stop(2);
    let state = cluster.files[2].dir.join("state");
    std::fs::remove_dir_all(&state).unwrap();
    delete_key(&a, "lost0");
    wait_until(Duration::from_secs(30), "the delete reaches master-b", || {
        !decided(&cluster.files[1].pki).contains_key("lost0")
    })
    .await;

    // Refused with EX_CONFIG (78), which the unit does not restart.
    let (code, output) = cluster.start_refused(2).await;
    assert_eq!(code, Some(78), "{output}");
    assert!(output.contains("state lost") && output.contains("salt-keysync recover --from-peers"), "{output}");
    assert!(decided(&c).contains_key("lost0"), "a refused start touches nothing");
    // `check` says so too (it passed here before, so systemd looped on `run`).
    let config = cluster.files[2].config_path.to_str().unwrap().to_string();
    let had_store = state.join("state.redb").exists();
    let check = run_cli(&["check", "--config", &config]);
    let report = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "{report}");
    assert!(report.lines().any(|l| l.starts_with("FAIL state lost")), "{report}");
    assert_eq!(state.join("state.redb").exists(), had_store, "check made a state store");

    // A corrupt store is refused too, naming the same command.
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("state.redb"), b"not a redb file, just garbage").unwrap();
    let (code, output) = cluster.start_refused(2).await;
    assert_eq!(code, Some(78), "{output}");
    assert!(output.contains("cannot open the state store") && output.contains("recover --from-peers"), "{output}");

    // As under the packaged unit, master-c's files are its agent's user's
    // (here nobody's); recover, run by root, acts as that user. It wrote
    // root's files, 0644, before: the agent could not open its new store, and
    // it took the agent's staging folder for a stranger's.
    let agent_user = 65534;
    let chown_all = |owner: u32| {
        let spec = format!("{owner}:{owner}");
        let status = std::process::Command::new("chown").args(["-R", &spec]).arg(&cluster.files[2].dir).status();
        assert!(status.unwrap().success(), "chown -R {spec} {}", cluster.files[2].dir.display());
    };
    std::fs::set_permissions(root.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    chown_all(agent_user);
    // `check` run by root judges owners as that user would, as the agent does.
    let check = run_cli(&["check", "--config", &config]);
    let report = String::from_utf8_lossy(&check.stdout);
    let fails: Vec<&str> = report.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(fails.len() == 1 && fails[0].contains("state lost"), "only the lost state: {report}");
    let recovered = run_cli(&["recover", "--from-peers", "--config", &config]);
    let stdout = String::from_utf8_lossy(&recovered.stdout);
    assert!(recovered.status.success(), "{stdout}{}", String::from_utf8_lossy(&recovered.stderr));
    assert!(stdout.contains("recovered 7 decisions"), "{stdout}");
    assert!(std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("state.redb.lost-")));
    let staging = cluster.files[2].pki.join(".keysync-staging");
    for (path, mode) in
        [(state.join("state.redb"), 0o600), (staging.clone(), 0o700), (staging.join(".salt-keysync-state"), 0o600)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (agent_user, mode), "{}", path.display());
    }
    let moved_aside: Vec<_> = std::fs::read_dir(&cluster.files[2].pki)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".refused-"))
        .collect();
    assert!(moved_aside.is_empty(), "recover replaced the agent's staging folder: {moved_aside:?}");
    // This test's agents run as root: back to root's.
    chown_all(0);

    cluster.start(2).await;
    converged(&cluster, Duration::from_secs(30)).await;
    assert!(!decided(&c).contains_key("lost0"), "the cluster's delete won over master-c's stale file");
    for idx in 0..3 {
        assert_winners_applied(&cluster, idx);
    }
    // Nothing master-c held resurrected lost0 anywhere.
    assert!(cluster.files.iter().all(|f| !decided(&f.pki).contains_key("lost0")));

    // Running it against a running agent is refused.
    let busy = run_cli(&["recover", "--from-peers", "--config", &config]);
    assert_eq!(busy.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&busy.stderr).contains("stop the agent"), "{busy:?}");
    cluster.stop_all();
}
