//! Issue 4, safe defaults: an agent refuses to start, naming the path and its
//! mode, when its config, TLS key or state folder is open to other users or
//! its key folders are writable by them; and when the salt-master keeps its
//! keys elsewhere (`keys.cache_driver`) or is part of a Salt cluster. `check`
//! reports the same problems without starting.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keysync_server::CertAuthority;
use keysync_tests::binary::{binary, free_addr, run_cli};
use keysync_tests::cluster::{write_agent_files, AgentFiles};
use salt_keysync::config::Config;
use tokio_util::sync::CancellationToken;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn fresh_agent(root: &Path, name: &str) -> AgentFiles {
    let ca = CertAuthority::new("ca").unwrap();
    write_agent_files(root, &ca, name, free_addr(), &[])
}

/// Starts the agent in-process and expects it to refuse, returning its error.
async fn refused_start(files: &AgentFiles) -> String {
    let config = Config::load(&files.config_path).unwrap();
    let shutdown = CancellationToken::new();
    let run = salt_keysync::agent::run(config, None, shutdown.clone());
    match tokio::time::timeout(Duration::from_secs(10), run).await {
        Ok(Err(e)) => format!("{e:#}"),
        Ok(Ok(())) => panic!("the agent ran and stopped instead of refusing"),
        Err(_) => panic!("the agent started instead of refusing"),
    }
}

#[tokio::test]
async fn too_open_paths_are_refused_with_path_mode_and_fix() {
    let root = tempfile::tempdir().unwrap();
    // (what is loosened, its mode, the requirement, the suggested chmod)
    let cases: [(&str, u32, &str, &str); 6] = [
        ("node.key", 0o644, "it must not be accessible by group or others", "600"),
        ("node.key", 0o640, "it must not be accessible by group or others", "600"),
        ("ca.pem", 0o666, "it must not be writable by group or others", "644"),
        ("state", 0o755, "it must not be accessible by others nor writable by group", "750"),
        ("pki", 0o777, "it must not be writable by group or others", "755"),
        ("pki/minions_rejected", 0o775, "it must not be writable by group or others", "755"),
    ];
    for (idx, (rel, mode, requirement, fix)) in cases.into_iter().enumerate() {
        let files = fresh_agent(root.path(), &format!("m{idx}"));
        let target = files.dir.join(rel);
        if rel == "state" {
            std::fs::create_dir(&target).unwrap();
        }
        chmod(&target, mode);
        let err = refused_start(&files).await;
        let want =
            format!("permissions {mode:04o} for '{}' are too open: {requirement} (chmod {fix})", target.display());
        assert_eq!(err, want, "{rel}");
        // Refused before the store or the audit log were opened.
        assert!(!files.dir.join("state/state.redb").exists(), "{rel}");
        assert!(!files.audit_log.exists(), "{rel}");
    }
}

/// Issue 14 items 1 and 2, as an attacker owning pki_dir would try it: a key
/// folder that is a symlink (`minions_rejected -> /etc/cron.hourly`, here a
/// folder outside) is refused at start and by `check`, and nothing is made
/// there; a staging folder that is not the agent's own (mode 0777, a
/// symlink at the marker's name in it) is moved aside and a private one
/// made, the symlink's target untouched.
#[tokio::test]
async fn symlinked_key_folders_are_refused_and_a_foreign_staging_folder_is_replaced() {
    let root = tempfile::tempdir().unwrap();
    let outside = root.path().join("cron.hourly");
    std::fs::create_dir(&outside).unwrap();
    let files = fresh_agent(root.path(), "m");
    std::fs::remove_dir(files.pki.join("minions_rejected")).unwrap();
    std::os::unix::fs::symlink(&outside, files.pki.join("minions_rejected")).unwrap();
    let err = refused_start(&files).await;
    assert!(err.contains("minions_rejected") && err.contains("symbolic link"), "{err}");
    let check = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(!check.status.success(), "{said}");
    assert!(
        said.lines().any(|l| l.starts_with("FAIL") && l.contains("minions_rejected") && l.contains("symbolic link")),
        "{said}"
    );
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing made outside pki_dir");

    let files = fresh_agent(root.path(), "n");
    let victim = root.path().join("victim");
    std::fs::write(&victim, "root's file").unwrap();
    let staging = files.pki.join(".keysync-staging");
    std::fs::create_dir(&staging).unwrap();
    chmod(&staging, 0o777);
    std::os::unix::fs::symlink(&victim, staging.join(".salt-keysync-state")).unwrap();
    let check = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(said.contains("moves it aside"), "{said}");
    let config = Config::load(&files.config_path).unwrap();
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(salt_keysync::agent::run(config, None, shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&files.audit_log).unwrap_or_default().contains("moved aside") {
        assert!(Instant::now() < deadline, "the replaced staging folder is audited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    agent.await.unwrap().unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's file");
    let meta = std::fs::symlink_metadata(&staging).unwrap();
    assert!(meta.is_dir() && meta.permissions().mode() & 0o7777 == 0o700);
}

/// Issue 14 item 1: Salt's cachedir, where `.dfn` goes, as a symlink (to a
/// folder outside) or a stranger's folder is refused at start and by
/// `check`, not found out at the first revocation; one not made yet is a
/// warning only.
#[tokio::test]
async fn a_symlinked_or_foreign_cachedir_is_refused_at_start_and_by_check() {
    let root = tempfile::tempdir().unwrap();
    let outside = root.path().join("elsewhere");
    std::fs::create_dir(&outside).unwrap();
    let files = fresh_agent(root.path(), "m");
    let cache = files.dir.join("cache");
    let _ = std::fs::remove_dir_all(&cache);
    std::os::unix::fs::symlink(&outside, &cache).unwrap();
    let err = refused_start(&files).await;
    assert!(err.contains("salt.cachedir") && err.contains("symbolic link"), "{err}");
    let check = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(!check.status.success(), "{said}");
    assert!(said.lines().any(|l| l.starts_with("FAIL") && l.contains("salt.cachedir")), "{said}");

    let files = fresh_agent(root.path(), "n");
    let cache = files.dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    std::os::unix::fs::chown(&cache, Some(4242), Some(4242)).unwrap();
    let err = refused_start(&files).await;
    assert!(err.contains("salt.cachedir") && err.contains("4242"), "{err}");

    let files = fresh_agent(root.path(), "o");
    let _ = std::fs::remove_dir_all(files.dir.join("cache"));
    let check = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(said.lines().any(|l| l.starts_with("WARN salt.cachedir") && l.contains("does not exist yet")), "{said}");
}

/// Issue 14 item 3: `check` tries a chown to the salt user and says so when
/// the agent's user cannot (the agent would start, then fail every write).
/// Run by root, it acts as the agent's user (the owner of state_dir: uid
/// 4242 here), which cannot give files to `daemon`.
#[test]
fn check_says_when_the_agents_user_cannot_give_files_to_the_salt_user() {
    let root = tempfile::tempdir().unwrap();
    chmod(root.path(), 0o755);
    let files = fresh_agent(root.path(), "m");
    let config = std::fs::read_to_string(&files.config_path).unwrap();
    std::fs::write(&files.config_path, config.replace("[salt]\n", "[salt]\nuser = \"daemon\"\n")).unwrap();
    std::fs::create_dir(files.dir.join("state")).unwrap();
    let status = Command::new("chown").args(["-R", "4242:4242"]).arg(&files.dir).status().unwrap();
    assert!(status.success());
    let check = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(!check.status.success(), "{said}");
    assert!(
        said.lines().any(|l| l.starts_with("FAIL")
            && l.contains("this user (uid 4242) cannot give files to the salt user (uid 1, gid 1)")),
        "{said}"
    );
}

#[tokio::test]
async fn a_missing_state_folder_is_created_private() {
    let root = tempfile::tempdir().unwrap();
    let files = fresh_agent(root.path(), "m");
    // Refused for another reason, after the state folder was made.
    std::fs::write(files.dir.join("salt-master.conf"), "cluster_id: prod\n").unwrap();
    refused_start(&files).await;
    let mode = std::fs::metadata(files.dir.join("state")).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);
}

#[tokio::test]
async fn masters_whose_key_folders_are_not_the_truth_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let cases = [
        (
            "keys.cache_driver: mmap_key\n",
            "keys.cache_driver is \"mmap_key\"; salt-keysync works only with localfs_key",
        ),
        ("keys:\n  cache_driver: mmap_key\n", "keys.cache_driver is \"mmap_key\""),
        ("interface: 127.0.0.2\ncluster_id: prod\n", "cluster_id is set (\"prod\")"),
    ];
    for (idx, (master_config, want)) in cases.into_iter().enumerate() {
        let files = fresh_agent(root.path(), &format!("m{idx}"));
        std::fs::write(files.dir.join("salt-master.conf"), master_config).unwrap();
        let err = refused_start(&files).await;
        assert!(err.contains(want), "{master_config:?}: {err}");
        assert!(!files.audit_log.exists());

        let check = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
        let stdout = String::from_utf8_lossy(&check.stdout);
        assert_eq!(check.status.code(), Some(1), "{stdout}");
        assert!(stdout.lines().any(|l| l.starts_with("FAIL") && l.contains(want)), "{stdout}");
    }
}

#[test]
fn the_binary_refuses_a_readable_config_and_check_lists_every_problem() {
    let root = tempfile::tempdir().unwrap();
    let files = fresh_agent(root.path(), "master-a");
    chmod(&files.config_path, 0o644);
    chmod(&files.dir.join("node.key"), 0o604);

    let mut child = Command::new(binary())
        .args(["run", "--config"])
        .arg(&files.config_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("salt-keysync run started with a world-readable config");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // EX_CONFIG: a refused start, which the unit does not restart.
    assert_eq!(output.status.code(), Some(78), "{stderr}");
    let config_problem = format!(
        "permissions 0644 for '{}' are too open: it must not be readable by others nor writable by group or others (chmod 640)",
        files.config_path.display()
    );
    assert_eq!(stderr.trim(), format!("salt-keysync: {config_problem}"));

    let check = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "{stdout}");
    let key_problem = format!("permissions 0604 for '{}' are too open", files.dir.join("node.key").display());
    assert!(stdout.contains(&format!("FAIL {config_problem}")), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("FAIL") && l.contains(&key_problem)), "{stdout}");

    chmod(&files.config_path, 0o600);
    chmod(&files.dir.join("node.key"), 0o600);
    let check = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{stdout}");
    assert!(stdout.contains("ok   permissions of the config, TLS files, state_dir and pki_dir"), "{stdout}");
}

/// Issue 28 item 3: a second agent on a pki_dir an agent serves (another
/// state_dir and port) said "state lost … recover --from-peers", and
/// following that advice rewrote the running agent's marker. Both are now
/// refused, naming the agent that serves the folders, and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_on_a_served_pki_dir_is_refused_and_named() {
    let root = tempfile::tempdir().unwrap();
    let first = fresh_agent(root.path(), "master-a");
    let shutdown = CancellationToken::new();
    let running =
        tokio::spawn(salt_keysync::agent::run(Config::load(&first.config_path).unwrap(), None, shutdown.clone()));
    let marker = first.pki.join(".keysync-staging/.salt-keysync-state");
    keysync_tests::wait_until(Duration::from_secs(20), "the first agent serves", || marker.exists()).await;
    let marker_before = std::fs::read(&marker).unwrap();

    // The same pki_dir, another state_dir and port.
    let text = std::fs::read_to_string(&first.config_path).unwrap();
    let listen = Config::load(&first.config_path).unwrap().listen.to_string();
    let second_state = root.path().join("second-state");
    std::fs::create_dir(&second_state).unwrap();
    chmod(&second_state, 0o700);
    let text = text
        .replace(&listen, &free_addr().to_string())
        .replace(&format!("{}/state", first.dir.display()), &second_state.display().to_string());
    let second = root.path().join("second.toml");
    std::fs::write(&second, text).unwrap();
    chmod(&second, 0o600);
    let config = Config::load(&second).unwrap();
    assert_eq!(config.pki_dir, Config::load(&first.config_path).unwrap().pki_dir);
    let want = format!("another agent (pid {}) serves this pki_dir", std::process::id());

    let run = salt_keysync::agent::run(config.clone(), None, CancellationToken::new());
    let refused = match tokio::time::timeout(Duration::from_secs(10), run).await {
        Ok(Err(e)) => format!("{e:#}"),
        Ok(Ok(())) => panic!("the second agent ran and stopped instead of refusing"),
        Err(_) => panic!("the second agent started instead of refusing"),
    };
    assert!(refused.contains(&want), "{refused}");
    let recovered = salt_keysync::cli::recover::recover_from_peers(&config, true).await.unwrap_err();
    assert!(format!("{recovered:#}").contains(&want), "{recovered:#}");
    assert_eq!(std::fs::read(&marker).unwrap(), marker_before, "the running agent's marker is untouched");

    shutdown.cancel();
    running.await.unwrap().unwrap();
    // Once it stopped, the folders are free again.
    let run = salt_keysync::agent::run(config, None, CancellationToken::new());
    if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(10), run).await {
        assert!(!format!("{e:#}").contains("another agent"), "{e:#}");
    }
}
