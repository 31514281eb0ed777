//! `salt-keysync demo` run as a newcomer would: it succeeds, prints each of
//! the three operations with its latency to both other masters, keeps its
//! files private, and removes its folder (at the end, or on Ctrl-C).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keysync_tests::binary::{binary, run_cli};

/// The folder the demo announced on its first line.
fn demo_folder(stdout: &str) -> PathBuf {
    let line = stdout.lines().find_map(|l| l.strip_prefix("demo folder: ")).expect("demo names its folder");
    PathBuf::from(line.trim())
}

/// Every operation line: `accept  web01  A→B 2.1 ms  A→C 2.4 ms`.
fn assert_three_operations(stdout: &str) {
    for (action, id) in [("accept", "web01"), ("reject", "db01"), ("delete", "web01")] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(action) && l.contains(id))
            .unwrap_or_else(|| panic!("no {action} line in:\n{stdout}"));
        for peer in ["A→B", "A→C"] {
            let after = line.split_once(peer).unwrap_or_else(|| panic!("{line:?} lacks {peer}")).1;
            let figure: f64 = after.split_whitespace().next().unwrap().parse().unwrap_or_else(|_| panic!("{line:?}"));
            assert!(figure > 0.0 && after.split_whitespace().nth(1) == Some("ms"), "{line:?}");
        }
    }
    assert!(stdout.contains(".dfn dropped on master-b and master-c"), "{stdout}");
    assert!(stdout.contains("all three decisions reached both other masters"), "{stdout}");
    for node in ["master-a", "master-b", "master-c"] {
        assert!(stdout.contains(&format!("{node}  accept   web01  applied")), "{node} audit missing:\n{stdout}");
    }
}

#[test]
fn demo_shows_three_operations_propagating_and_cleans_up() {
    // The README's demo command, as written: the binary `cargo run` builds, with its arguments.
    let command = keysync_tests::docs::block("README.md", "<!-- test: demo -->");
    let args = command.split_once("cargo run --release -p salt-keysync -- ").expect("a cargo run of the agent").1;
    let out = run_cli(&args.split_whitespace().collect::<Vec<_>>());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_three_operations(&stdout);
    let folder = demo_folder(&stdout);
    assert!(!folder.exists(), "{} was not removed", folder.display());
}

fn walk(dir: &Path, seen: &mut Vec<(PathBuf, u32, bool)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.metadata().unwrap();
        seen.push((entry.path(), meta.permissions().mode() & 0o777, meta.is_dir()));
        if meta.is_dir() {
            walk(&entry.path(), seen);
        }
    }
}

#[test]
fn demo_keep_leaves_only_private_files() {
    let out = run_cli(&["demo", "--keep"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo --keep failed:\n{stdout}");
    let folder = demo_folder(&stdout);
    let mut seen = Vec::new();
    walk(&folder, &mut seen);
    let n_files = seen.iter().filter(|(_, _, dir)| !dir).count();
    std::fs::remove_dir_all(&folder).unwrap();
    assert!(n_files >= 15, "certs, configs, keys, stores and audit logs of three agents: {seen:?}");
    for (path, mode, is_dir) in &seen {
        // Minion public keys a peer writes get Salt's own mode, 0644, as on a real master; the
        // folders above them are 0700, so no other user reaches them either.
        let minion_key = path.parent().is_some_and(|p| p.parent().is_some_and(|pp| pp.ends_with("pki")));
        let want = match (is_dir, minion_key) {
            (true, _) => 0o700,
            (false, true) => 0o644,
            (false, false) => 0o600,
        };
        assert!(mode & !want == 0, "{} has mode {mode:04o}, more than {want:04o}", path.display());
    }
}

#[test]
fn demo_hold_stops_and_cleans_up_on_ctrl_c() {
    let mut child = Command::new(binary()).args(["demo", "--hold"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stdout = String::new();
    let started = Instant::now();
    while !stdout.contains("Press Ctrl-C") {
        assert!(started.elapsed() < Duration::from_secs(60), "demo --hold never got ready:\n{stdout}");
        let Some(line) = lines.next() else { panic!("demo --hold ended early:\n{stdout}") };
        stdout.push_str(&line.unwrap());
        stdout.push('\n');
    }
    assert_three_operations(&stdout);
    let folder = demo_folder(&stdout);
    assert!(folder.join("master-a/config.toml").exists(), "the cluster's files exist while it holds");
    let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    for line in lines {
        stdout.push_str(&line.unwrap());
        stdout.push('\n');
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "Ctrl-C while holding is the normal end: {status}\n{stdout}");
    assert!(stdout.contains("SIGINT: stopping"), "{stdout}");
    assert!(!folder.exists(), "{} was not removed after Ctrl-C", folder.display());
}
