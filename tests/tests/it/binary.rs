//! Black-box tests of the `salt-keysync` binary: CLI errors, and three agent
//! processes started with `run --config` replicating Salt-style operations.

use std::time::Duration;

use keysync_server::CertAuthority;
use keysync_tests::binary::{free_addr, run_cli, ProcessCluster};
use keysync_tests::cluster::write_agent_files;
use keysync_tests::salt_ops::{master_writes_pending, move_key, new_public_key, path, SaltLine};
use keysync_tests::wait_until;

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
    let key = new_public_key();
    let cluster = ProcessCluster::start(dir.path(), 3, |f| master_writes_pending(&f.pki, "web01", &key));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        move_key(SaltLine::S3008, &cluster.files[0].pki, "web01", "minions");
        for f in &cluster.files[1..] {
            wait_until(Duration::from_secs(20), "accept reaches the peer", || {
                std::fs::read(path(&f.pki, "minions", "web01")).is_ok_and(|bytes| bytes == key.as_bytes())
                    && !path(&f.pki, "minions_pre", "web01").exists()
            })
            .await;
        }
    });
    cluster.stop();
}
