//! Issue 28 item 5, `check` predicts `run`: a listen address another program
//! holds fails `check`, naming the holder, and is a temporary failure for
//! `run` (retried, then exit 75, which the unit restarts; it was 78, which
//! the unit never restarts), while the running agent's own sockets are no
//! failure; a `[salt] master_config` the config names that does not exist
//! fails `check` and `run` with the same words (it was "ok … defaults
//! assumed", and `run` assumed them silently).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use keysync_server::CertAuthority;
use keysync_tests::binary::{free_addr, run_cli, AgentProcess};
use keysync_tests::cluster::{write_agent_files, AgentFiles};
use salt_keysync::config::Config;

fn agent_files(root: &Path) -> AgentFiles {
    write_agent_files(root, &CertAuthority::new("ca").unwrap(), "master-a", free_addr(), &[])
}

fn listen_of(files: &AgentFiles) -> SocketAddr {
    Config::load(&files.config_path).unwrap().listen
}

/// `metrics_listen = ADDRESS` at the top of the config.
fn with_metrics(files: &AgentFiles, address: SocketAddr) {
    let text = std::fs::read_to_string(&files.config_path).unwrap();
    std::fs::write(&files.config_path, format!("metrics_listen = \"{address}\"\n{text}")).unwrap();
}

/// `check`'s exit code and stdout.
fn check(files: &AgentFiles) -> (Option<i32>, String) {
    let out = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Polls `agent`'s log until `want` holds (`timeout` at most), failing with
/// the log if the agent exits first.
fn log_until(agent: &mut AgentProcess, timeout: Duration, what: &str, want: impl Fn(&str) -> bool) {
    let start = Instant::now();
    loop {
        let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
        if want(&log) {
            return;
        }
        if let Some(status) = agent.try_wait() {
            panic!("{what}: the agent exited ({status}) first:\n{log}");
        }
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for the agent to exit (60 s at most) and returns its exit code.
fn exit_code(agent: &mut AgentProcess) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = agent.try_wait() {
            return status.code();
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the agent is still running after 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn check_fails_on_a_listen_address_another_program_holds_and_names_it() {
    let root = tempfile::tempdir().unwrap();
    let files = agent_files(root.path());
    let (listen, metrics) = (listen_of(&files), free_addr());
    with_metrics(&files, metrics);
    let (code, said) = check(&files);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains(&format!("ok   listen {listen} is free\n")), "{said}");
    assert!(said.contains(&format!("ok   metrics_listen {metrics} is free\n")), "{said}");

    let _taken = std::net::TcpListener::bind(listen).unwrap();
    let _taken_too = std::net::TcpListener::bind(metrics).unwrap();
    let (code, said) = check(&files);
    assert_eq!(code, Some(1), "{said}");
    let me = std::process::id();
    for (what, address) in [("listen", listen), ("metrics_listen", metrics)] {
        let want = format!("FAIL {what} {address} is in use by pid {me} (");
        let line = said.lines().find(|l| l.starts_with(&want)).unwrap_or_else(|| panic!("{want:?} not in:\n{said}"));
        assert!(line.ends_with(&format!("stop that program, or choose another {what}")), "{line}");
    }
}

#[test]
fn check_passes_beside_the_running_agent_whose_sockets_they_are() {
    let root = tempfile::tempdir().unwrap();
    let files = agent_files(root.path());
    let (listen, metrics) = (listen_of(&files), free_addr());
    with_metrics(&files, metrics);
    let mut agent = AgentProcess::start(&files.config_path, files.dir.join("agent.log"));
    log_until(&mut agent, Duration::from_secs(30), "the agent starts", |log| log.contains("agent started"));
    let (code, said) = check(&files);
    assert_eq!(code, Some(0), "{said}");
    let pid = agent.pid();
    assert!(said.contains(&format!("ok   listen {listen} in use by the running agent (pid {pid})\n")), "{said}");
    assert!(
        said.contains(&format!("ok   metrics_listen {metrics} in use by the running agent (pid {pid})\n")),
        "{said}"
    );
    assert!(said.contains("all checks passed"), "{said}");
    assert!(agent.stop().success());
}

/// The packaged unit restarts every failure but 78: exit 75 is restarted.
fn unit_restarts(code: i32) -> bool {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/salt-keysync.service");
    let unit = std::fs::read_to_string(unit).unwrap();
    let listed = |key: &str| {
        unit.lines()
            .filter_map(|l| l.strip_prefix(key))
            .any(|values| values.split_whitespace().any(|v| v == code.to_string()))
    };
    unit.lines().any(|l| l == "Restart=on-failure")
        && !listed("RestartPreventExitStatus=")
        && !listed("SuccessExitStatus=")
}

#[test]
fn run_retries_a_listen_address_in_use_then_exits_with_a_status_the_unit_restarts() {
    let root = tempfile::tempdir().unwrap();
    let files = agent_files(root.path());
    let listen = listen_of(&files);
    let taken = std::net::TcpListener::bind(listen).unwrap();
    let me = std::process::id();
    let retrying = format!("listen {listen} is in use by pid {me} (");
    let mut agent = AgentProcess::start(&files.config_path, files.dir.join("agent.log"));
    log_until(&mut agent, Duration::from_secs(30), "the agent says who holds the address", |log| {
        log.contains(&retrying) && log.contains("trying again in 1 s")
    });
    let started = Instant::now();
    let code = exit_code(&mut agent);
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert_eq!(code, Some(75), "{log}");
    assert!(started.elapsed() > Duration::from_secs(10), "it retried for 15 s: {:?}", started.elapsed());
    assert!(unit_restarts(75) && !unit_restarts(78), "the packaged unit restarts 75, not 78");
    let last = log.lines().last().unwrap();
    assert!(
        last.starts_with(&format!("salt-keysync: {retrying}"))
            && last.contains("still after 15 s of retries; exiting with status 75"),
        "{log}"
    );
    drop(taken);

    // Freed while it retries: it starts.
    let taken = std::net::TcpListener::bind(listen).unwrap();
    let mut agent = AgentProcess::start(&files.config_path, files.dir.join("agent-2.log"));
    log_until(&mut agent, Duration::from_secs(30), "the agent retries", |log| log.contains(&retrying));
    drop(taken);
    log_until(&mut agent, Duration::from_secs(30), "the agent starts once the address is free", |log| {
        log.contains("agent started")
    });
    assert!(agent.stop().success());
}

#[test]
fn a_named_master_config_that_does_not_exist_fails_check_and_run_alike() {
    let root = tempfile::tempdir().unwrap();
    let files = agent_files(root.path());
    let named = files.dir.join("salt-master.conf");
    let (code, said) = check(&files);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains(&format!("ok   salt master config {} uses the local key folders", named.display())));

    std::fs::remove_file(&named).unwrap();
    let want = format!(
        "salt.master_config {} does not exist: correct the path, or remove the line to assume Salt's defaults (as \
         for a master without a config file)",
        named.display()
    );
    let (code, said) = check(&files);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.lines().any(|l| l == format!("FAIL {want}")), "{said}");
    let mut agent = AgentProcess::start(&files.config_path, files.dir.join("agent.log"));
    let code = exit_code(&mut agent);
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert_eq!(code, Some(78), "{log}");
    assert_eq!(log.trim(), format!("salt-keysync: {want}"));
}
