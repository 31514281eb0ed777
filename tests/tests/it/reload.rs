//! Config reload without a restart, on real agent processes: SIGHUP adds and
//! removes peers without dropping the unchanged link, loads new certificates
//! and CAs on both the listener and the outgoing links, and refuses a broken
//! config while the old one keeps replicating.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use keysync_server::{CertAuthority, TlsMaterial, TlsSetup};
use keysync_tests::binary::ProcessCluster;
use keysync_tests::cluster::AgentFiles;
use keysync_tests::salt_ops::{master_writes_pending, move_key, new_public_key, path, SaltLine};
use keysync_tests::{eventually, wait_until};
use salt_keysync::disk::audit::{read_verified, Record};

const WAIT: Duration = Duration::from_secs(30);

fn audit(files: &AgentFiles) -> Vec<Record> {
    // A line being appended right now reads as malformed: count it on the next poll.
    read_verified(&files.audit_log).unwrap_or_default()
}

fn n_records(files: &AgentFiles, pred: impl Fn(&Record) -> bool) -> usize {
    audit(files).iter().filter(|r| pred(r)).count()
}

fn connects_from(files: &AgentFiles, peer: &str) -> usize {
    n_records(files, |r| r.action == "connect" && r.peer.as_deref() == Some(peer))
}

fn refusals_of(files: &AgentFiles, peer: &str) -> usize {
    n_records(files, |r| r.action == "refuse" && r.peer.as_deref().is_some_and(|p| p.split(',').any(|n| n == peer)))
}

fn reloads(files: &AgentFiles, outcome: &str) -> Vec<String> {
    audit(files)
        .into_iter()
        .filter(|r| r.action == "reload" && r.outcome == outcome)
        .map(|r| r.reason.unwrap_or_default())
        .collect()
}

/// Replaces a file by a new one of mode 0600 (as an operator's config and keys should be).
fn write_private(path: &Path, text: &[u8]) {
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).unwrap();
    file.write_all(text).unwrap();
}

/// The config with only the `[[peer]]` sections of `keep`, plus `add` (name, address).
fn set_peers(files: &AgentFiles, keep: &[&str], add: &[(&str, String)]) {
    let text = std::fs::read_to_string(&files.config_path).unwrap();
    let mut sections = text.split("\n[[peer]]\n");
    let mut out = sections.next().unwrap().trim_end().to_string();
    out.push('\n');
    for section in sections {
        if keep.iter().any(|name| section.contains(&format!("name = \"{name}\""))) {
            out.push_str(&format!("\n[[peer]]\n{}\n", section.trim_end()));
        }
    }
    for (name, address) in add {
        out.push_str(&format!("\n[[peer]]\nname = \"{name}\"\naddress = \"{address}\"\n"));
    }
    write_private(&files.config_path, out.as_bytes());
}

fn listen_address(files: &AgentFiles) -> String {
    let text = std::fs::read_to_string(&files.config_path).unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix("listen = ")).unwrap();
    line.trim_matches('"').to_string()
}

fn has_key(files: &AgentFiles, folder: &str, id: &str, key: &str) -> bool {
    std::fs::read(path(&files.pki, folder, id)).is_ok_and(|bytes| bytes == key.as_bytes())
}

/// salt-key -a on `files`' master for a key that just arrived there.
fn accept_new(files: &AgentFiles, id: &str) -> String {
    let key = new_public_key();
    master_writes_pending(&files.pki, id, &key);
    move_key(SaltLine::S3008, &files.pki, id, "minions");
    key
}

#[test]
fn sighup_adds_and_removes_peers_without_dropping_the_unchanged_link() {
    let root = tempfile::tempdir().unwrap();
    // master-a and master-b know each other; master-c (a new master) knows only master-a.
    let cluster = ProcessCluster::start(root.path(), 3, |f| match f.name.as_str() {
        "master-a" => set_peers(f, &["master-b"], &[]),
        "master-b" => set_peers(f, &["master-a"], &[]),
        _ => set_peers(f, &["master-a"], &[]),
    });
    let (a, b, c) = (&cluster.files[0], &cluster.files[1], &cluster.files[2]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        let key = accept_new(a, "web01");
        wait_until(WAIT, "web01 reaches master-b", || has_key(b, "minions", "web01", &key)).await;
        wait_until(WAIT, "master-a refuses master-c, not yet a peer", || refusals_of(a, "master-c") > 0).await;
        assert!(!path(&c.pki, "minions", "web01").exists(), "master-c got web01 before it was a peer");
        // A link makes two connections (its rounds', its pushes'), each audited.
        wait_until(WAIT, "both master-a/master-b links are up", || {
            connects_from(a, "master-b") >= 2 && connects_from(b, "master-a") >= 2
        })
        .await;
        let links_ab = (connects_from(a, "master-b"), connects_from(b, "master-a"));

        set_peers(a, &["master-b"], &[("master-c", listen_address(c))]);
        cluster.signal(0, "HUP");
        wait_until(WAIT, "web01 reaches the added peer master-c", || has_key(c, "minions", "web01", &key)).await;
        let applied = reloads(a, "applied");
        assert!(applied.len() == 1 && applied[0].starts_with("peers +master-c;"), "{applied:?}");
        assert_eq!(
            (connects_from(a, "master-b"), connects_from(b, "master-a")),
            links_ab,
            "the unchanged master-a/master-b links were re-established: {:?}",
            audit(a)
        );

        let n_refused_b = refusals_of(a, "master-b");
        set_peers(a, &["master-c"], &[]);
        cluster.signal(0, "HUP");
        wait_until(WAIT, "the removal is applied", || reloads(a, "applied").len() == 2).await;
        assert!(reloads(a, "applied")[1].starts_with("peers -master-b;"), "{:?}", reloads(a, "applied"));
        // master-b's connection was closed; when its link comes back it is refused.
        wait_until(WAIT, "master-a refuses the removed master-b", || refusals_of(a, "master-b") > n_refused_b).await;
    });
    cluster.stop();
}

fn ca_pem(files: &AgentFiles) -> String {
    std::fs::read_to_string(files.dir.join("ca.pem")).unwrap()
}

/// Moves `files`' node to a certificate of `new_ca`, trusting both CAs meanwhile.
fn move_to_ca(files: &AgentFiles, old_ca_pem: &str, new_ca: &CertAuthority) {
    let now = time::OffsetDateTime::now_utc();
    let issued =
        new_ca.issue(&[files.name.as_str()], now - time::Duration::hours(1), now + time::Duration::days(1)).unwrap();
    write_private(&files.dir.join("ca.pem"), format!("{old_ca_pem}{}", new_ca.cert_pem()).as_bytes());
    write_private(&files.dir.join("node.pem"), issued.cert_pem.as_bytes());
    write_private(&files.dir.join("node.key"), issued.key_pem.as_bytes());
}

/// Connects to `files`' listener trusting only `ca`, as a peer named master-b issued by `ca`.
async fn serves_cert_of(files: &AgentFiles, ca: &CertAuthority) -> bool {
    let now = time::OffsetDateTime::now_utc();
    let issued = ca.issue(&["master-b"], now - time::Duration::hours(1), now + time::Duration::days(1)).unwrap();
    let tls = TlsSetup::new(&TlsMaterial {
        ca_pem: ca.cert_pem().into_bytes(),
        cert_pem: issued.cert_pem.into_bytes(),
        key_pem: issued.key_pem.into_bytes(),
    })
    .unwrap();
    keysync_server::connect(&listen_address(files), &files.name, &tls, 1 << 20, Duration::from_secs(5)).await.is_ok()
}

#[test]
fn sighup_loads_new_certificates_on_the_listener_and_the_links() {
    let root = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(root.path(), 2, |_| {});
    let new_ca = CertAuthority::new("new CA").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        let (a, b) = (&cluster.files[0], &cluster.files[1]);
        assert!(!serves_cert_of(a, &new_ca).await, "master-a serves a new-CA certificate before the change");
        let old_ca_pem = ca_pem(a);

        move_to_ca(a, &old_ca_pem, &new_ca);
        let n_refused = refusals_of(b, "master-a");
        cluster.signal(0, "HUP");
        wait_until(WAIT, "master-a reloads", || !reloads(a, "applied").is_empty()).await;
        assert!(reloads(a, "applied")[0].contains("CA and certificate reloaded"), "{:?}", reloads(a, "applied"));
        eventually(WAIT, "the listener serves the new certificate", || serves_cert_of(a, &new_ca)).await;
        // master-b still trusts only the old CA: master-a's outgoing link now presents the new
        // certificate and is refused there.
        wait_until(WAIT, "master-b refuses master-a's new certificate", || refusals_of(b, "master-a") > n_refused)
            .await;

        // master-b learns the new CA too: replication resumes both ways.
        write_private(&b.dir.join("ca.pem"), format!("{old_ca_pem}{}", new_ca.cert_pem()).as_bytes());
        cluster.signal(1, "HUP");
        wait_until(WAIT, "master-b reloads", || !reloads(b, "applied").is_empty()).await;
        let key = accept_new(a, "web01");
        wait_until(WAIT, "an accept on master-a reaches master-b", || has_key(b, "minions", "web01", &key)).await;
        let key = accept_new(b, "db01");
        wait_until(WAIT, "an accept on master-b reaches master-a", || has_key(a, "minions", "db01", &key)).await;
    });
    cluster.stop();
}

#[test]
fn a_broken_config_is_refused_and_the_old_one_keeps_replicating() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = ProcessCluster::start(root.path(), 2, |_| {});
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        let good = std::fs::read_to_string(&cluster.files[0].config_path).unwrap();
        let cases = [
            (format!("{good}\nthis is not toml"), "config"),
            (good.replace("node = \"master-a\"", "node = \"master-z\""), "node cannot change while running"),
            (good.replace("/node.pem\"", "/missing.pem\""), "cannot read tls.cert"),
            (good.replace("/state\"", "/state2\""), "state_dir, audit_log cannot change while running"),
            (good.replace("[tls]", "[tls]\nkey_password = \"x\""), "unknown field `key_password`"),
        ];
        for (n, (text, reason)) in cases.iter().enumerate() {
            write_private(&cluster.files[0].config_path, text.as_bytes());
            cluster.signal(0, "HUP");
            let a = &cluster.files[0];
            wait_until(WAIT, "the reload is refused", || reloads(a, "refused").len() == n + 1).await;
            let got = &reloads(a, "refused")[n];
            assert!(got.contains(reason), "{got:?} should contain {reason:?}");
        }
        assert!(cluster.agent(0).is_running(), "a refused reload stopped the agent");
        let log = std::fs::read_to_string(cluster.files[0].dir.join("agent.log")).unwrap();
        assert!(log.contains("config reload refused; the running config stays in force"), "{log}");

        // The old config is still in force, both ways.
        let (a, b) = (&cluster.files[0], &cluster.files[1]);
        let key = accept_new(a, "web01");
        wait_until(WAIT, "an accept on master-a reaches master-b", || has_key(b, "minions", "web01", &key)).await;
        let key = accept_new(b, "db01");
        wait_until(WAIT, "an accept on master-b reaches master-a", || has_key(a, "minions", "db01", &key)).await;
        assert!(reloads(a, "applied").is_empty());
    });
    cluster.stop();
}
