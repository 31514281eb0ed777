//! Black-box tests of the `salt-keysync` binary: CLI errors, and three agent
//! processes started with `run --config` replicating Salt-style operations.

use std::net::SocketAddr;
use std::time::Duration;

use keysync_server::CertAuthority;
use keysync_tests::binary::{run_cli, AgentProcess};
use keysync_tests::cluster::{write_agent_files, NAMES};
use keysync_tests::salt_ops::{master_writes_pending, move_key, new_public_key, path, SaltLine};
use keysync_tests::wait_until;

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[test]
fn check_names_the_bad_key_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("ca").unwrap();
    let files = write_agent_files(dir.path(), &ca, "master-a", free_addr(), &[]);
    let ok = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{stdout}{}", String::from_utf8_lossy(&ok.stderr));
    assert!(stdout.contains("all checks passed"), "{stdout}");

    let text = std::fs::read_to_string(&files.config_path).unwrap();
    std::fs::write(&files.config_path, format!("lisen = \"1.2.3.4:5\"\n{text}")).unwrap();
    let bad = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr.contains("unknown field `lisen`"), "{stderr}");

    std::fs::write(&files.config_path, text.replace("node = \"master-a\"", "node = \"master-z\"")).unwrap();
    let wrong_name = run_cli(&["check", "--config", files.config_path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&wrong_name.stdout);
    assert!(stdout.contains("node \"master-z\" is not a DNS name of tls.cert"), "{stdout}");
    assert_eq!(wrong_name.status.code(), Some(1));
}

#[test]
fn three_agent_processes_replicate_an_accept_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("ca").unwrap();
    let addrs: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect();
    let files: Vec<_> = (0..3)
        .map(|i| {
            let peers: Vec<(String, SocketAddr)> =
                (0..3).filter(|&j| j != i).map(|j| (NAMES[j].to_string(), addrs[j])).collect();
            write_agent_files(dir.path(), &ca, NAMES[i], addrs[i], &peers)
        })
        .collect();
    let key = new_public_key();
    for f in &files {
        master_writes_pending(&f.pki, "web01", &key);
    }
    let agents: Vec<AgentProcess> =
        files.iter().map(|f| AgentProcess::start(&f.config_path, f.dir.join("agent.log"))).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // The first start records the pending keys; wait until every agent is up.
        for f in &files {
            let log = f.dir.join("agent.log");
            wait_until(Duration::from_secs(20), "agent started", || {
                std::fs::read_to_string(&log).is_ok_and(|text| text.contains("agent started"))
            })
            .await;
        }
        move_key(SaltLine::S3008, &files[0].pki, "web01", "minions");
        for f in &files[1..] {
            wait_until(Duration::from_secs(20), "accept reaches the peer", || {
                std::fs::read(path(&f.pki, "minions", "web01")).is_ok_and(|bytes| bytes == key.as_bytes())
                    && !path(&f.pki, "minions_pre", "web01").exists()
            })
            .await;
        }
    });
    for agent in agents {
        let log = agent.log.clone();
        let status = agent.stop();
        assert!(status.success(), "agent exited with {status}: {}", std::fs::read_to_string(log).unwrap());
    }
}
