//! Certificates for the agent from `salt-keysync certs init/issue` and from
//! the operations guide's openssl recipe (run as written, with the `openssl` CLI): both
//! sets carry two agent processes that replicate an accept.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use keysync_tests::binary::{run_cli, ProcessCluster};
use keysync_tests::salt_ops::{master_writes_pending, move_key, new_public_key, path, SaltLine};
use keysync_tests::wait_until;

const NODES: [&str; 2] = ["master-a", "master-b"];

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn cli_ok(args: &[&str]) -> String {
    let out = run_cli(args);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "salt-keysync {args:?} failed: {text}");
    text
}

fn cli_fails(args: &[&str], want: &str) {
    let out = run_cli(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "salt-keysync {args:?} should fail: {stderr}");
    assert!(stderr.contains(want), "salt-keysync {args:?}: {stderr:?} should contain {want:?}");
}

/// Starts two agent processes using `tls/ca.pem`, `tls/<node>.pem` and
/// `tls/<node>.key`, and checks that an accept on master-a reaches master-b.
fn two_agents_replicate_with(tls: &Path) {
    let root = tempfile::tempdir().unwrap();
    let key = new_public_key();
    let cluster = ProcessCluster::start(root.path(), 2, |f| {
        for (from, to) in [
            ("ca.pem".to_string(), "ca.pem"),
            (format!("{}.pem", f.name), "node.pem"),
            (format!("{}.key", f.name), "node.key"),
        ] {
            std::fs::copy(tls.join(from), f.dir.join(to)).unwrap();
        }
        master_writes_pending(&f.pki, "web01", &key);
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        move_key(SaltLine::S3008, &cluster.files[0].pki, "web01", "minions");
        let b = &cluster.files[1];
        wait_until(Duration::from_secs(20), "the accept reaches master-b", || {
            std::fs::read(path(&b.pki, "minions", "web01")).is_ok_and(|bytes| bytes == key.as_bytes())
        })
        .await;
    });
    cluster.stop();
}

#[test]
fn certs_init_and_issue_make_safe_files_that_agents_use() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let tls_arg = tls.to_str().unwrap();
    cli_ok(&["certs", "init", "--dir", tls_arg]);
    assert_eq!(mode(&tls), 0o700);
    assert_eq!(mode(&tls.join("ca.key")), 0o600);
    for node in NODES {
        cli_ok(&["certs", "issue", node, "--dir", tls_arg, "--days", "30"]);
        assert_eq!(mode(&tls.join(format!("{node}.key"))), 0o600);
        let pem = std::fs::read_to_string(tls.join(format!("{node}.pem"))).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
    }

    // Nothing is overwritten, and the files stay as they were.
    let ca_before = std::fs::read(tls.join("ca.pem")).unwrap();
    cli_fails(&["certs", "init", "--dir", tls_arg], "already exists");
    cli_fails(&["certs", "issue", "master-a", "--dir", tls_arg], "already exists");
    assert_eq!(std::fs::read(tls.join("ca.pem")).unwrap(), ca_before);
    cli_fails(&["certs", "issue", "not a name", "--dir", tls_arg], "is not a valid DNS name");
    let empty = dir.path().join("empty");
    cli_fails(
        &["certs", "issue", "master-c", "--dir", empty.to_str().unwrap()],
        "make a CA first: salt-keysync certs init",
    );
    // The old one-shot form is gone: it must not be mistaken for a name list.
    cli_fails(&["certs", "--out", tls_arg, "master-c"], "unexpected argument");

    two_agents_replicate_with(&tls);
}

/// README.md's `certs` commands, run as written (the agent binary on PATH),
/// make a CA and the node certificates they name, keys 0600.
#[test]
fn readme_certs_commands_make_a_ca_and_node_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let script = keysync_tests::docs::block("README.md", "<!-- test: certs -->");
    let bin_dir = keysync_tests::binary::binary().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}\nfailed: {}", String::from_utf8_lossy(&out.stderr));
    let tls = dir.path().join("tls");
    for file in ["ca.pem", "ca.key", "master-a.pem", "master-a.key", "master-b.pem", "master-b.key"] {
        assert!(tls.join(file).exists(), "{file} made");
    }
    for key in ["ca.key", "master-a.key", "master-b.key"] {
        assert_eq!(mode(&tls.join(key)), 0o600, "{key}");
    }
}

fn bash(dir: &Path, script: &str) {
    let out = Command::new("bash").arg("-euo").arg("pipefail").arg("-c").arg(script).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{script}\nfailed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The openssl commands docs/operations.md documents for sites with their own CA,
/// run exactly as written (node name substituted), make certificates the
/// agent accepts in both directions.
#[test]
fn documented_openssl_recipe_makes_certificates_agents_use() {
    let found = Command::new("openssl").arg("version").output();
    assert!(
        found.as_ref().is_ok_and(|out| out.status.success()),
        "this test needs the openssl CLI: apt-get install openssl ({found:?})"
    );
    let dir = tempfile::tempdir().unwrap();
    bash(dir.path(), &keysync_tests::docs::block("docs/operations.md", "<!-- openssl: CA -->"));
    let node_recipe = keysync_tests::docs::block("docs/operations.md", "<!-- openssl: node -->");
    assert!(node_recipe.starts_with("NAME=master-a\n"), "{node_recipe}");
    for node in NODES {
        bash(dir.path(), &node_recipe.replacen("NAME=master-a", &format!("NAME={node}"), 1));
        assert_eq!(mode(&dir.path().join(format!("{node}.key"))), 0o600, "openssl writes keys 0600");
    }
    two_agents_replicate_with(dir.path());
}
