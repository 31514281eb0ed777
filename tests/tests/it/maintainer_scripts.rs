//! Issue 27 item 9: the package's maintainer scripts run as root in and
//! around folders the salt user owns. `tests/packaging/salt-user-vs-scripts.sh`
//! plays that user against the real Debian postrm, RPM %postun and
//! `packaging/owners` at their real paths, inside a mount namespace of its
//! own (overlays and tmpfs: the host is never touched): symlinks at the
//! names they move to, a folder of root's put in the staging folder's place,
//! paths swapped between a check and the act. Root must do nothing through
//! them. And `owners` no longer hands the staging folder of an agent that
//! ran as root over: the agent, running as salt, moves it aside at its
//! start and goes on (checked here with the agent itself).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use keysync_server::CertAuthority;
use keysync_tests::binary::free_addr;
use keysync_tests::cluster::write_agent_files;
use keysync_tests::wait_until;
use salt_keysync::config::Config;
use salt_keysync::disk::audit::read_verified;
use tokio_util::sync::CancellationToken;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs the harness for one script (`postrm`, `postun` or `owners`) in a
/// mount namespace of its own; fails with every scenario that failed.
fn play_the_salt_user_against(script: &str) {
    let scratch = tempfile::tempdir().unwrap();
    let harness = repo().join("tests/packaging/salt-user-vs-scripts.sh");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "bash"])
        .arg(&harness)
        .arg(scratch.path())
        .arg(script)
        .output()
        .expect("run unshare (util-linux)");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.code() != Some(2) && !said.contains("unshare failed"),
        "this test runs the package scripts as root in a mount namespace of its own (unshare --mount, \
         overlayfs, tmpfs, setpriv) and needs root with CAP_SYS_ADMIN, as the CI container has:\n{said}"
    );
    assert!(out.status.success(), "{}: the salt user steered root:\n{said}", harness.display());
    assert!(said.lines().filter(|l| l.starts_with("ok ")).count() >= 2, "no scenario ran:\n{said}");
}

#[test]
fn debian_postrm_purge_never_acts_through_the_salt_users_paths() {
    play_the_salt_user_against("postrm");
}

#[test]
fn rpm_postun_erase_never_acts_through_the_salt_users_paths() {
    play_the_salt_user_against("postun");
}

#[test]
fn owners_never_acts_through_the_salt_users_paths() {
    play_the_salt_user_against("owners");
}

/// What `owners` relies on since it leaves the staging folder of an agent
/// that ran as root alone: the agent, now another user (here root is the
/// agent and the old folder a stranger's), moves it aside at its start,
/// audits that, makes its own and starts as usual. The state marker is
/// lost with the old folder, and that is no "state lost": an initialized
/// store without a marker is taken as one from before markers, and the
/// marker is written again naming the same store.
#[tokio::test]
async fn a_staging_folder_left_by_another_user_is_moved_aside_and_the_start_goes_on() {
    let root = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("ca").unwrap();
    let files = write_agent_files(root.path(), &ca, "master-a", free_addr(), &[]);
    let staging = files.pki.join(".keysync-staging");
    let marker = |dir: &Path| std::fs::read_to_string(dir.join(".salt-keysync-state")).unwrap();
    let run_until_started = |n_starts: usize| {
        let config = Config::load(&files.config_path).unwrap();
        let audit_log = files.audit_log.clone();
        async move {
            let shutdown = CancellationToken::new();
            let agent = tokio::spawn(salt_keysync::agent::run(config, None, shutdown.clone()));
            wait_until(Duration::from_secs(20), "the agent started", || {
                agent.is_finished()
                    || read_verified(&audit_log)
                        .is_ok_and(|records| records.iter().filter(|r| r.action == "start").count() == n_starts)
            })
            .await;
            assert!(!agent.is_finished(), "the agent stopped: {:?}", agent.await);
            shutdown.cancel();
            agent.await.unwrap().unwrap();
        }
    };
    run_until_started(1).await;
    let first = marker(&staging);
    assert!(first.contains("\nstore "), "{first}");

    // The folder and the marker become another user's, as an agent that
    // ran as root leaves them for one running as salt.
    let stranger = 65534;
    let status = Command::new("chown").args(["-R", &format!("{stranger}:{stranger}")]).arg(&staging).status();
    assert!(status.unwrap().success(), "chown -R {stranger} {}", staging.display());
    run_until_started(2).await;

    let records = read_verified(&files.audit_log).unwrap();
    let refused: Vec<_> =
        records.iter().filter(|r| r.reason.as_deref().is_some_and(|why| why.contains("moved aside"))).collect();
    assert_eq!(refused.len(), 1, "the replaced staging folder is audited once: {records:?}");
    let aside: Vec<PathBuf> = std::fs::read_dir(&files.pki)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".keysync-staging.refused-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(marker(&aside[0]), first, "the old folder is moved whole");
    assert_eq!(std::fs::metadata(&aside[0]).unwrap().uid(), stranger);
    let meta = std::fs::metadata(&staging).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (rustix::process::geteuid().as_raw(), 0o700));
    assert_eq!(marker(&staging), first, "the new marker names the same store");
}

/// The same, with the agent's user really another one than root, as after
/// an upgrade from 0.1.0 (found by the rolling upgrade of
/// `tests/systemd/rolling.sh`): 0.1.0's unit made the staging folder as
/// root, mode 0700, so the agent now running as the salt user (here
/// `nobody`) cannot even open it. It exited 78 ("the agent's staging folder
/// …: Permission denied") and the upgraded master stayed without an agent;
/// now it moves the folder aside all the same and starts, and `check` (run
/// by root, acting as the agent's user) notes it instead of failing.
#[test]
fn a_staging_folder_root_made_0700_is_moved_aside_by_an_agent_that_cannot_open_it() {
    use keysync_tests::binary::{run_cli, AgentProcess, ProcessCluster};
    use std::os::unix::fs::PermissionsExt;

    let id = |flag: &str| -> u32 {
        let out = Command::new("id").args([flag, "nobody"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let user = (id("-u"), id("-g"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let files = ProcessCluster::write_files(root.path(), 1).remove(0);
    let state = files.dir.join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let status = Command::new("chown").args(["-R", &format!("{}:{}", user.0, user.1)]).arg(&files.dir).status();
    assert!(status.unwrap().success());
    // As 0.1.0's unit made it (ExecStartPre=+install -d -m 0700), root's.
    let staging = files.pki.join(".keysync-staging");
    std::fs::create_dir(&staging).unwrap();
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(staging.join(".salt-keysync-state"), "store 0123\nnode master-a\n").unwrap();
    assert_eq!(std::fs::metadata(&staging).unwrap().uid(), 0, "the test runs as root");

    let check = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let said = format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    assert!(!said.lines().any(|l| l.starts_with("FAIL")), "{said}");
    assert!(said.contains("the agent moves it aside and makes its own at start"), "{said}");

    let as_user = ["setpriv", &format!("--reuid={}", user.0), &format!("--regid={}", user.1), "--clear-groups"]
        .map(std::ffi::OsString::from);
    let mut agent = AgentProcess::start_wrapped(&files.config_path, files.dir.join("agent.log"), "info", &as_user);
    let started =
        |agent: &AgentProcess| std::fs::read_to_string(&agent.log).is_ok_and(|log| log.contains("agent started"));
    rt.block_on(wait_until(Duration::from_secs(20), "the agent started as nobody, or stopped", || {
        started(&agent) || agent.try_wait().is_some()
    }));
    assert!(started(&agent), "{}", std::fs::read_to_string(&agent.log).unwrap());
    assert!(agent.stop().success());

    let aside: Vec<PathBuf> = std::fs::read_dir(&files.pki)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".keysync-staging.refused-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::metadata(&aside[0]).unwrap().uid(), 0, "root's folder moved whole");
    let meta = std::fs::metadata(&staging).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (user.0, 0o700));
    let records = read_verified(&files.audit_log).unwrap();
    assert!(
        records.iter().any(|r| r.reason.as_deref().is_some_and(|why| why.contains("who cannot open it"))),
        "the refusal is audited with its cause: {records:?}"
    );
}
