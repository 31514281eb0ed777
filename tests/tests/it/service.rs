//! Issue 18: what the packaged systemd unit relies on, with the real binary.
//! A start refused before the agent is ready exits 78 (the unit does not
//! restart it); the lines the binary prints itself carry journald
//! priorities when, and only when, their stream is the journal's;
//! `salt-keysync reload` (the unit's ExecReload) says whether the agent took
//! the new config; a peer that cannot be reached is a warning naming why.
//! tests/systemd/run.sh checks the same under a real systemd.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use keysync_server::CertAuthority;
use keysync_tests::binary::{binary, free_addr, run_cli, AgentProcess, ProcessCluster};
use keysync_tests::cluster::write_agent_files;
use keysync_tests::wait_until;

/// Runs `salt-keysync ARGS` with stdout and stderr going to `out`, which
/// `JOURNAL_STREAM` names (as systemd does for a unit logging to the journal)
/// when `journal` is set.
fn run_into(args: &[&str], out: &Path, journal: bool) -> (Option<i32>, String) {
    let file = File::create(out).unwrap();
    let meta = file.metadata().unwrap();
    let mut command = Command::new(binary());
    command.args(args).stdin(Stdio::null()).stdout(file.try_clone().unwrap()).stderr(file);
    // Named either way: only a stream that is the journal's gets priorities.
    let named = if journal { format!("{}:{}", meta.dev(), meta.ino()) } else { format!("{}:1", meta.dev()) };
    command.env("JOURNAL_STREAM", named);
    let status = command.status().unwrap();
    (status.code(), std::fs::read_to_string(out).unwrap())
}

#[test]
fn a_refused_start_exits_78_with_its_cause_at_err_priority() {
    let root = tempfile::tempdir().unwrap();
    let files = write_agent_files(root.path(), &CertAuthority::new("ca").unwrap(), "master-a", free_addr(), &[]);
    let config = files.config_path.to_str().unwrap();
    std::fs::set_permissions(&files.config_path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, text) = run_into(&["run", "--config", config], &root.path().join("journal"), true);
    assert_eq!(code, Some(78), "{text}");
    assert!(text.starts_with("<3>salt-keysync: permissions 0644 for "), "{text}");
    let (code, text) = run_into(&["run", "--config", config], &root.path().join("terminal"), false);
    assert_eq!(code, Some(78), "{text}");
    assert!(text.starts_with("salt-keysync: permissions 0644 for "), "no prefix outside the journal: {text}");

    // A refusal after the config loaded (the TLS key is gone) is one too.
    std::fs::set_permissions(&files.config_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::remove_file(files.dir.join("node.key")).unwrap();
    let (code, text) = run_into(&["run", "--config", config], &root.path().join("journal"), true);
    assert_eq!(code, Some(78), "{text}");
    assert!(text.lines().any(|l| l.starts_with("<3>salt-keysync: ") && l.contains("node.key")), "{text}");

    // `check`: ok lines at info, FAIL lines at err.
    let (code, text) = run_into(&["check", "--config", config], &root.path().join("check"), true);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.lines().any(|l| l.starts_with("<6>ok   config ")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("<3>FAIL ") && l.contains("node.key")), "{text}");
    assert!(text.lines().all(|l| l.starts_with('<')), "every line has its priority: {text}");
}

fn reload(config: &Path) -> Output {
    run_cli(&["reload", "--config", config.to_str().unwrap()])
}

#[test]
fn reload_says_what_changed_or_why_it_was_refused() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = ProcessCluster::start(root.path(), 2, |_| {});
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.started());
    let a = cluster.files[0].config_path.clone();
    let good = std::fs::read_to_string(&a).unwrap();

    let out = reload(&a);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.starts_with(&format!("reloaded {}: ", a.display())),
        "a summary of what changed, naming the file read: {stdout}"
    );

    // Refused: listen cannot change while running. systemctl reload fails with the reason.
    let listen = good.lines().find(|l| l.starts_with("listen = ")).unwrap();
    std::fs::write(&a, good.replace(listen, &format!("listen = \"{}\"", free_addr()))).unwrap();
    let out = reload(&a);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let refused = format!("salt-keysync: reload of {} refused, the running config stays in force: ", a.display());
    assert!(stderr.starts_with(&refused), "{stderr}");
    assert!(stderr.contains("listen"), "{stderr}");

    // A config that does not even parse is refused by the agent, not guessed at here.
    std::fs::write(&a, format!("{good}\nthis is not toml")).unwrap();
    let out = reload(&a);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with(&refused), "{stderr}");
    assert!(cluster.agent(0).is_running(), "a refused reload stopped the agent");

    std::fs::write(&a, &good).unwrap();
    assert!(reload(&a).status.success());
    cluster.stop();

    let out = reload(&a);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is not running"), "{stderr}");
}

#[test]
fn an_unreachable_peer_is_a_warning_that_says_why() {
    let root = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("ca").unwrap();
    // Nothing listens at master-b's address.
    let files = write_agent_files(root.path(), &ca, "master-a", free_addr(), &[("master-b".to_string(), free_addr())]);
    let agent = AgentProcess::start(&files.config_path, root.path().join("agent.log"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let warning = || {
        std::fs::read_to_string(&agent.log)
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains("WARN") && l.contains("sync failed"))
            .map(str::to_string)
    };
    rt.block_on(wait_until(Duration::from_secs(20), "a sync failed warning", || warning().is_some()));
    let line = warning().unwrap();
    assert!(line.to_lowercase().contains("connection refused"), "the cause is missing: {line}");
    drop(agent);
}
