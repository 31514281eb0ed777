//! Seeded randomised soak: three agent processes, random accept / reject /
//! delete operations (Salt 3006 and 3008 style) on random masters, mixed with
//! kill -9, clean restarts, and partitions healed later. At the end all
//! decided folders are identical and each id holds what the highest version
//! in the audit logs says (every decision accounted for).
//!
//! `SOAK_SEED=n` replays a run (the seed is printed, also on failure);
//! `SOAK_OPS=n` sets its length. CI runs the short default; the long form is
//! run by hand, e.g.
//! `SOAK_OPS=5000 cargo test -p keysync-tests --test faults soak -- --nocapture`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use keysync_tests::binary::FaultCluster;
use keysync_tests::salt_ops::{path, FOLDERS};

use crate::common::{assert_winners_applied, divergent, key_pool};

/// About 30 s of operations in CI (~45 faults); the long form sets SOAK_OPS.
const DEFAULT_OPS: u64 = 1500;
const N_IDS: usize = 40;

/// splitmix64: small, seedable, stable across versions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

#[derive(Default, Debug)]
struct Tally {
    ops: u64,
    accepts: u64,
    rejects: u64,
    deletes: u64,
    pending: u64,
    lost_to_races: u64,
    kills: u64,
    restarts: u64,
    partitions: u64,
    released: usize,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak() {
    let _serial = crate::common::SERIAL.lock().await;
    let seed = env_u64("SOAK_SEED")
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs());
    let n_ops = env_u64("SOAK_OPS").unwrap_or(DEFAULT_OPS);
    eprintln!("soak: SOAK_SEED={seed} SOAK_OPS={n_ops}");
    let replay =
        format!("replay with SOAK_SEED={seed} SOAK_OPS={n_ops} cargo test -p keysync-tests --test faults soak");
    let mut rng = Rng(seed);
    let keys = key_pool(12);
    let ids: Vec<String> = (0..N_IDS).map(|i| format!("soak{i:02}")).collect();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = FaultCluster::create(root.path(), 3, |_, _| {}).await;
    cluster.start_all().await;
    let pkis: Vec<_> = cluster.files.iter().map(|f| f.pki.clone()).collect();

    let mut tally = Tally::default();
    // Agents down, and when to bring each back (in ops); a partition and when it heals.
    let mut back_at: Vec<Option<u64>> = vec![None; 3];
    let mut heal_at: Option<u64> = None;
    let started = Instant::now();
    for op in 0..n_ops {
        for (idx, back) in back_at.iter_mut().enumerate() {
            if back.is_some_and(|at| at <= op) {
                *back = None;
                cluster.start(idx).await;
                tally.restarts += 1;
            }
        }
        if heal_at.is_some_and(|at| at <= op) {
            heal_at = None;
            cluster.heal();
        }
        // A fault every ~40 operations; never all three down at once.
        if rng.pct(3) {
            let idx = rng.below(3) as usize;
            let n_down = back_at.iter().filter(|b| b.is_some()).count();
            match rng.below(3) {
                0 | 1 if cluster.is_running(idx) && n_down < 2 => {
                    if rng.pct(70) {
                        cluster.kill9(idx);
                        tally.kills += 1;
                    } else {
                        cluster.stop(idx);
                    }
                    back_at[idx] = Some(op + 10 + rng.below(50));
                }
                _ if heal_at.is_none() => {
                    cluster.partition(&[&[idx], &[(idx + 1) % 3, (idx + 2) % 3]]);
                    heal_at = Some(op + 10 + rng.below(60));
                    tally.partitions += 1;
                }
                _ => {}
            }
        }
        let pki = &pkis[rng.below(3) as usize];
        let id = &ids[rng.below(N_IDS as u64) as usize];
        let salt_3008 = rng.pct(50);
        let in_folder = FOLDERS.iter().find(|f| path(pki, f, id).exists()).copied();
        let done = match in_folder {
            None => {
                tally.pending += 1;
                write_pending(pki, id, &keys[rng.below(keys.len() as u64) as usize])
            }
            Some(from) => match rng.below(3) {
                0 => {
                    tally.accepts += 1;
                    move_key(pki, id, from, "minions", salt_3008)
                }
                1 => {
                    tally.rejects += 1;
                    move_key(pki, id, from, "minions_rejected", salt_3008)
                }
                _ => {
                    tally.deletes += 1;
                    delete_key(pki, id)
                }
            },
        };
        if done.is_err() {
            // The agent applied a peer's decision to the same id meanwhile,
            // as a second operator's salt-key would have.
            tally.lost_to_races += 1;
        }
        tally.ops += 1;
        tokio::time::sleep(Duration::from_millis(2 + rng.below(20))).await;
    }
    cluster.heal();
    for idx in 0..3 {
        if !cluster.is_running(idx) {
            cluster.start(idx).await;
            tally.restarts += 1;
        }
    }
    let chaos = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut next_release = Instant::now();
    while !divergent(&cluster).is_empty() && Instant::now() < deadline {
        // Random deletes come in bursts the blast-radius guard may hold: an
        // operator releases them, as one would after checking `salt-keysync held`.
        if Instant::now() >= next_release {
            tally.released += crate::common::release_held(&cluster).await;
            next_release = Instant::now() + Duration::from_secs(3);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let converge_time = started.elapsed() - chaos;
    let n_divergent = divergent(&cluster).len();
    eprintln!(
        "soak: seed {seed}: {} operations ({} accept, {} reject, {} delete, {} pending written, {} lost to races) \
         in {chaos:.1?}, converged {converge_time:.1?} later ({} held deletes released); faults: {} kill -9, {} restarts, {} partitions; divergent keys at the end: {n_divergent}",
        tally.ops,
        tally.accepts,
        tally.rejects,
        tally.deletes,
        tally.pending,
        tally.lost_to_races,
        tally.released,
        tally.kills,
        tally.restarts,
        tally.partitions
    );
    eprintln!("soak: {replay}");
    assert_eq!(n_divergent, 0, "keys diverge after 120 s: {:?}; {replay}", divergent(&cluster));
    for idx in 0..3 {
        assert_winners_applied(&cluster, idx);
    }
    cluster.stop_all();
}

/// The master writing a pending key in place (it may lose a race with the agent).
fn write_pending(pki: &Path, id: &str, key: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(path(
        pki,
        "minions_pre",
        id,
    ))?;
    file.write_all(key.as_bytes())
}

/// `salt-key -a/-r`, Salt 3006 (one rename) or 3008 (remove everywhere, tmp + rename).
fn move_key(pki: &Path, id: &str, from: &str, to: &str, salt_3008: bool) -> std::io::Result<()> {
    if !salt_3008 {
        return std::fs::rename(path(pki, from, id), path(pki, to, id));
    }
    let bytes = std::fs::read(path(pki, from, id))?;
    for folder in FOLDERS {
        let _ = std::fs::remove_file(path(pki, folder, id));
    }
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path(pki, to, &format!("tmp{:08x}", seq.wrapping_mul(0x9E37_79B9)));
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?.write_all(&bytes)?;
    std::fs::rename(&tmp, path(pki, to, id))
}

/// `salt-key -d`.
fn delete_key(pki: &Path, id: &str) -> std::io::Result<()> {
    for folder in FOLDERS {
        let _ = std::fs::remove_file(path(pki, folder, id));
    }
    Ok(())
}
