//! Issue 29 item 5: a downgrade, and what the older release leaves behind.
//! A store of a newer format is refused at start (exit 78) and by `check`,
//! naming the releases and the way out, and `recover --from-peers` is that
//! way out; files an agent or `recover` run as root left in the agent's
//! user's folders stop that user's agent (exit 78), `check` says so, and
//! `hand-over` (what the packages run) gives them back.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use keysync_tests::binary::{run_cli, AgentProcess, ProcessCluster};
use keysync_tests::wait_until;
use salt_keysync::disk::store::format::{Format, FORMAT};

fn said(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn started(agent: &AgentProcess, n: usize) -> bool {
    std::fs::read_to_string(&agent.log).is_ok_and(|log| log.matches("agent started").count() >= n)
}

/// A release that wrote a newer format than this one reads is refused with
/// 78 and both versions, before anything is written; `check` fails saying
/// the same; `recover --from-peers` (the way out it names) moves the store
/// aside and rebuilds it, and the agent starts.
#[test]
fn a_store_of_a_newer_format_is_refused_and_recover_is_the_way_out() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = ProcessCluster::start(root.path(), 2, |_| {});
    rt.block_on(cluster.started());
    let (config, dir) = (cluster.files[0].config_path.clone(), cluster.files[0].dir.clone());
    cluster.signal(0, "TERM");
    rt.block_on(wait_until(Duration::from_secs(20), "master-a's agent stops", || {
        cluster.agent(0).try_wait().is_some()
    }));
    let state = dir.join("state");
    let newer = Format { number: FORMAT + 1, written_by: "9.1.0".into(), read_since: "9.0.0".into() };
    salt_keysync::disk::store::format::set_for_tests(&state, &newer);

    let mut refused = AgentProcess::start(&config, dir.join("refused.log"));
    rt.block_on(wait_until(Duration::from_secs(20), "the agent exits or starts", || {
        refused.try_wait().is_some() || started(&refused, 1)
    }));
    let text = std::fs::read_to_string(&refused.log).unwrap();
    assert_eq!(refused.try_wait().and_then(|status| status.code()), Some(78), "{text}");
    for words in [
        format!("in format {}", FORMAT + 1),
        "written by salt-keysync 9.1.0".into(),
        format!("this is salt-keysync {}", env!("CARGO_PKG_VERSION")),
        "install salt-keysync 9.0.0 or later again".into(),
        "recover --from-peers".into(),
    ] {
        assert!(text.contains(&words), "no {words:?} in: {text}");
    }
    assert!(!text.contains("corrupt"), "{text}");
    assert_eq!(salt_keysync::disk::store::format::peek(&state).unwrap(), Some(newer.clone()), "the store was changed");

    let check = run_cli(&["check", "--config", config.to_str().unwrap()]);
    let text = said(&check);
    assert!(!check.status.success(), "{text}");
    assert!(text.lines().any(|l| l.starts_with("FAIL") && l.contains("written by salt-keysync 9.1.0")), "{text}");

    let out = run_cli(&["recover", "--from-peers", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("old state moved to"), "{}", said(&out));
    assert_eq!(salt_keysync::disk::store::format::read_text(&state).unwrap(), Some(Format::this_release()));
    let again = AgentProcess::start(&config, dir.join("agent-again.log"));
    rt.block_on(wait_until(Duration::from_secs(20), "the agent started on the recovered store", || started(&again, 1)));
    assert!(again.stop().success());
    cluster.stop();
}

/// The agent's user: `nobody`, which /etc/passwd names on any host.
fn nobody() -> (u32, u32) {
    let out = Command::new("id").args(["-u", "nobody"]).output().unwrap();
    let uid = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let out = Command::new("id").args(["-g", "nobody"]).output().unwrap();
    (uid, String::from_utf8_lossy(&out.stdout).trim().parse().unwrap())
}

fn chown(path: &Path, (uid, gid): (u32, u32), recursive: bool) {
    let mut cmd = Command::new("chown");
    if recursive {
        cmd.arg("-R");
    }
    assert!(cmd.arg(format!("{uid}:{gid}")).arg(path).status().unwrap().success());
}

/// Issue 29 item 5, as it happened: the agent runs as its user (here
/// `nobody`); a downgrade's agent and `recover`, run as root, leave the
/// lock and the marker root's in that user's staging folder, and the store
/// root's 0644. The re-upgraded agent exits 78 on them; `check` says which;
/// `hand-over --user` (run as root by the packages' owners script) gives
/// them back, narrowed, and the agent starts.
#[test]
fn files_a_root_run_agent_left_are_handed_over_and_the_agent_starts() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let files = keysync_tests::binary::ProcessCluster::write_files(root.path(), 1).remove(0);
    let user = nobody();
    let state = files.dir.join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown(&files.dir, user, true);
    let as_user = ["setpriv", &format!("--reuid={}", user.0), &format!("--regid={}", user.1), "--clear-groups"]
        .map(std::ffi::OsString::from);
    let run_as_user =
        |log: &str| AgentProcess::start_wrapped(&files.config_path, files.dir.join(log), "info", &as_user);
    let mut first = run_as_user("first.log");
    rt.block_on(wait_until(Duration::from_secs(20), "the agent started as nobody, or stopped", || {
        started(&first, 1) || first.try_wait().is_some()
    }));
    assert!(started(&first, 1), "{}", std::fs::read_to_string(&first.log).unwrap());
    assert!(first.stop().success());

    let staging = files.pki.join(".keysync-staging");
    let (marker, lock, store) =
        (staging.join(".salt-keysync-state"), staging.join(".salt-keysync-lock"), state.join("state.redb"));
    for path in [&marker, &lock, &store] {
        chown(path, (0, 0), false);
    }
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut refused = run_as_user("refused.log");
    rt.block_on(wait_until(Duration::from_secs(20), "the agent exits", || refused.try_wait().is_some()));
    let log = std::fs::read_to_string(&refused.log).unwrap();
    assert_eq!(refused.try_wait().unwrap().code(), Some(78), "{log}");
    assert!(log.contains("/usr/lib/salt-keysync/owners"), "the refusal does not name the fix: {log}");
    // The store handed back alone, the lock is next: it names the fix too.
    chown(&store, user, false);
    let mut refused = run_as_user("refused-lock.log");
    rt.block_on(wait_until(Duration::from_secs(20), "the agent exits", || refused.try_wait().is_some()));
    let log = std::fs::read_to_string(&refused.log).unwrap();
    assert_eq!(refused.try_wait().unwrap().code(), Some(78), "{log}");
    assert!(log.contains("Permission denied") && log.contains("/usr/lib/salt-keysync/owners"), "{log}");
    chown(&store, (0, 0), false);

    // check, run by root, acts as the owner of state_dir and names the store.
    let check = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let text = said(&check);
    assert!(!check.status.success(), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL") && l.contains(&store.display().to_string()) && l.contains("owned by uid 0")),
        "{text}"
    );

    let out = run_cli(&["hand-over", "--user", "nobody", "--config", files.config_path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", said(&out));
    for path in [&marker, &lock, &store] {
        let meta = std::fs::metadata(path).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (user.0, 0o600), "{} after hand-over", path.display());
    }
    let mut again = run_as_user("again.log");
    rt.block_on(wait_until(Duration::from_secs(20), "the agent started again as nobody, or stopped", || {
        started(&again, 1) || again.try_wait().is_some()
    }));
    assert!(started(&again, 1), "{}", std::fs::read_to_string(&again.log).unwrap());
    assert!(again.stop().success());
}

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs tests/packaging/salt-user-vs-scripts.sh for `script` in a mount
/// namespace of its own (as `maintainer_scripts.rs` does), with this
/// build's binary; fails with every scenario that failed.
fn play_the_salt_user_against(script: &str) {
    let scratch = tempfile::tempdir().unwrap();
    let harness = repo().join("tests/packaging/salt-user-vs-scripts.sh");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "bash"])
        .arg(&harness)
        .arg(scratch.path())
        .arg(script)
        .env("SALT_KEYSYNC_BIN", keysync_tests::binary::binary())
        .output()
        .expect("run unshare (util-linux)");
    let said = said(&out);
    assert!(
        out.status.code() != Some(2) && !said.contains("unshare failed"),
        "this test runs the package scripts as root in a mount namespace of its own and needs root with \
         CAP_SYS_ADMIN, as the CI container has:\n{said}"
    );
    assert!(out.status.success(), "{}:\n{said}", harness.display());
    assert!(said.lines().filter(|l| l.starts_with("ok ")).count() >= 2, "no scenario ran:\n{said}");
}

/// The Debian preinst and prerm and the RPM %pre refuse a store of a newer
/// format (naming both releases and the way out), pass this format or no
/// store, and read state.format as the salt user, who owns its folder:
/// never through its symlink, never waiting on its FIFO.
#[test]
fn the_package_scripts_refuse_a_store_they_cannot_read() {
    play_the_salt_user_against("format");
}

/// Issue 29 item 5: the re-upgrade's agent exited 78 and apt returned 0.
/// Now an upgrade whose agent does not start again fails, saying why.
#[test]
fn an_upgrade_whose_agent_does_not_start_again_fails() {
    play_the_salt_user_against("postinst");
}

/// The three scripts that read the format hold the same lines, and read
/// the format the binary reads.
#[test]
fn the_package_scripts_know_the_binarys_format() {
    let block = |path: &str| -> String {
        let text = std::fs::read_to_string(repo().join(path)).unwrap();
        let start = text.find("# ---- the state store's format").unwrap_or_else(|| panic!("{path}: no format block"));
        let end = text.find("# ---- end of the state store's format").unwrap_or_else(|| panic!("{path}: no end"));
        text[start..end].to_string()
    };
    let preinst = block("packaging/debian/preinst");
    assert_eq!(block("packaging/debian/prerm"), preinst, "prerm and preinst differ");
    assert_eq!(block("packaging/rpm/pre.sh"), preinst, "pre.sh and preinst differ");
    assert!(preinst.contains(&format!("\nreads={FORMAT}\n")), "{preinst}");
}
