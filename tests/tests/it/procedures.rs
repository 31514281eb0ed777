//! Issue 20: procedures the documents give, run as written on agent
//! processes. SECURITY.md's "Cut off one stolen node certificate at once":
//! rename the master, reload its peers, `recover --from-peers` on it.

use std::time::Duration;

use keysync_server::{CertAuthority, TlsMaterial, TlsSetup};
use keysync_tests::binary::{free_addr, run_cli, AgentProcess};
use keysync_tests::cluster::{write_agent_files, write_private, AgentFiles};
use keysync_tests::salt_ops::{master_writes_pending, move_key, new_public_key, path, SaltLine};
use keysync_tests::wait_until;

const WAIT: Duration = Duration::from_secs(30);

fn cli_ok(args: &[&str]) -> String {
    let out = run_cli(args);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{args:?}: {text}");
    text
}

fn started(rt: &tokio::runtime::Runtime, agent: &AgentProcess, n: usize) {
    rt.block_on(wait_until(WAIT, "agent started", || {
        std::fs::read_to_string(&agent.log).is_ok_and(|log| log.matches("agent started").count() >= n)
    }));
}

fn accepted_on(rt: &tokio::runtime::Runtime, files: &AgentFiles, id: &str, key: &str) {
    rt.block_on(wait_until(WAIT, &format!("{id} accepted on {}", files.name), || {
        std::fs::read(path(&files.pki, "minions", id)).is_ok_and(|bytes| bytes == key.as_bytes())
    }));
}

#[test]
fn a_stolen_certificate_is_cut_off_by_renaming_the_master() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let root = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("ca").unwrap();
    let addrs = [free_addr(), free_addr(), free_addr()];
    let names = ["master-a", "master-b", "master-c"];
    let files: Vec<AgentFiles> = (0..3)
        .map(|i| {
            let peers: Vec<(String, std::net::SocketAddr)> =
                (0..3).filter(|&j| j != i).map(|j| (names[j].to_string(), addrs[j])).collect();
            write_agent_files(root.path(), &ca, names[i], addrs[i], &peers)
        })
        .collect();
    let (web01, web02) = (new_public_key(), new_public_key());
    for f in &files {
        master_writes_pending(&f.pki, "web01", &web01);
        master_writes_pending(&f.pki, "web02", &web02);
    }
    let log = |f: &AgentFiles| f.dir.join("agent.log");
    let a = AgentProcess::start(&files[0].config_path, log(&files[0]));
    let mut b = AgentProcess::start_with(&files[1].config_path, log(&files[1]), &[]);
    let c = AgentProcess::start(&files[2].config_path, log(&files[2]));
    for agent in [&a, &b, &c] {
        started(&rt, agent, 1);
    }
    move_key(SaltLine::S3008, &files[0].pki, "web01", "minions");
    accepted_on(&rt, &files[1], "web01", &web01);
    let stolen = TlsMaterial {
        ca_pem: std::fs::read(files[1].dir.join("ca.pem")).unwrap(),
        cert_pem: std::fs::read(files[1].dir.join("node.pem")).unwrap(),
        key_pem: std::fs::read(files[1].dir.join("node.key")).unwrap(),
    };

    // 1. A certificate for master-b2, installed on that master.
    let dir = root.path().join("ca-dir");
    std::fs::create_dir(&dir).unwrap();
    write_private(&dir.join("ca.pem"), ca.cert_pem());
    write_private(&dir.join("ca.key"), ca.key_pem());
    cli_ok(&["certs", "issue", "master-b2", "--dir", dir.to_str().unwrap()]);
    std::fs::copy(dir.join("master-b2.pem"), files[1].dir.join("node.pem")).unwrap();
    std::fs::copy(dir.join("master-b2.key"), files[1].dir.join("node.key")).unwrap();

    // 2. master-b becomes master-b2 in the other masters' lists; reload.
    for f in [&files[0], &files[2]] {
        let text = std::fs::read_to_string(&f.config_path).unwrap();
        write_private(&f.config_path, text.replace("name = \"master-b\"", "name = \"master-b2\""));
        cli_ok(&["reload", "--config", f.config_path.to_str().unwrap()]);
    }
    // The stolen certificate is refused at the handshake.
    let setup = TlsSetup::new(&stolen).unwrap();
    let refused = rt.block_on(keysync_server::probe(&addrs[0].to_string(), "master-a", &setup)).unwrap_err();
    assert_eq!(keysync_server::alert_received(&refused.cause).as_deref(), Some("access denied"), "{refused}");

    // 3. On the renamed master: stop, rename, recover, start.
    assert!(b.stop().success());
    let text = std::fs::read_to_string(&files[1].config_path).unwrap();
    write_private(&files[1].config_path, text.replace("node = \"master-b\"", "node = \"master-b2\""));
    let config_b = files[1].config_path.to_str().unwrap();
    // Moving state_dir aside instead is refused: the marker names the old store.
    let state = files[1].dir.join("state");
    std::fs::rename(&state, files[1].dir.join("state.aside")).unwrap();
    let out = run_cli(&["check", "--config", config_b]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("state lost"), "{}", String::from_utf8_lossy(&out.stdout));
    std::fs::rename(files[1].dir.join("state.aside"), &state).unwrap();
    let recovered = cli_ok(&["recover", "--from-peers", "--config", config_b]);
    assert!(recovered.contains("master-a: ") && recovered.contains("old state moved to"), "{recovered}");
    b = AgentProcess::start_with(&files[1].config_path, log(&files[1]), &[]);
    started(&rt, &b, 2);

    // It replicates under its new name, both ways.
    accepted_on(&rt, &files[1], "web01", &web01);
    move_key(SaltLine::S3008, &files[1].pki, "web02", "minions");
    accepted_on(&rt, &files[0], "web02", &web02);
    accepted_on(&rt, &files[2], "web02", &web02);
    for agent in [a, b, c] {
        assert!(agent.stop().success());
    }
}
