//! Black-box tests of the `salt-keysync` binary: CLI errors, and three agent
//! processes started with `run --config` replicating Salt-style operations.

use std::time::Duration;

use keysync_server::CertAuthority;
use keysync_tests::binary::{free_addr, run_cli, FaultCluster, ProcessCluster};
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

/// An empty master joining a peer with more keys than two fetches bring:
/// the keys of each chunk after the first are written ahead (into the
/// staging folder's `writer-4/` and on) while the chunk before is applied,
/// renamed into place byte for byte, and nothing is left behind there. Its debug
/// log times each step of each batch.
#[test]
fn a_joining_master_writes_each_next_chunk_ahead_and_leaves_nothing_staged() {
    const N: usize = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<String> = (0..3).map(|_| new_public_key()).collect();
    let name = |i: usize| format!("join{i:05}");
    let folder = |i: usize| if i.is_multiple_of(10) { "minions_rejected" } else { "minions" };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut cluster = FaultCluster::create(dir.path(), 2, |i, f| {
            for id in (0..N).filter(|_| i == 0) {
                std::fs::write(path(&f.pki, folder(id), &name(id)), &keys[id % keys.len()]).unwrap();
            }
        })
        .await;
        cluster.env[1].push(("SALT_KEYSYNC_LOG".into(), "info,salt_keysync::node::effects=debug".into()));
        // master-a holds its keys before master-b, empty, joins it: B fetches them.
        cluster.start(0).await;
        cluster.start(1).await;
        let pki = cluster.files[1].pki.clone();
        wait_until(Duration::from_secs(120), "master-b holds every key", || {
            (0..N).rev().all(|i| std::fs::read(path(&pki, folder(i), &name(i))).is_ok())
        })
        .await;
        // The write-ahead folders: writer-4/ and on, one per writer.
        let ahead: Vec<_> = (4..8).map(|n| pki.join(format!(".keysync-staging/writer-{n}"))).collect();
        assert!(ahead[0].is_dir(), "{} was never made: nothing was written ahead", ahead[0].display());
        wait_until(Duration::from_secs(20), "nothing left written ahead", || {
            ahead.iter().all(|dir| std::fs::read_dir(dir).map_or(!dir.exists(), |mut files| files.next().is_none()))
        })
        .await;
        for i in 0..N {
            assert_eq!(std::fs::read(path(&pki, folder(i), &name(i))).unwrap(), keys[i % keys.len()].as_bytes());
        }
        // The chunks after the first (about 3,000 keys) were renamed from
        // ahead; the last one's line comes just after its last rename.
        let renamed_ahead = |log: &str| -> usize {
            log.lines()
                .filter_map(|line| {
                    line.split("renamed_ahead=").nth(1)?.split_whitespace().next()?.parse::<usize>().ok()
                })
                .sum()
        };
        let log_path = cluster.log(1);
        wait_until(Duration::from_secs(20), "2,000 keys or more renamed from ahead", || {
            renamed_ahead(&std::fs::read_to_string(&log_path).unwrap_or_default()) >= 2_000
        })
        .await;
        let log = std::fs::read_to_string(&log_path).unwrap();
        // Each step's time, as docs/performance.md's per-batch timings name them.
        for step in ["journalled_us=", "written_us=", "synced_us=", "recorded_us=", "audited_us="] {
            assert!(log.contains(step), "no {step} in master-b's debug log:\n{log}");
        }
        cluster.stop_all();
    });
}
