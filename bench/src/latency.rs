//! Live figures on a fresh three-agent cluster: single accept / reject /
//! delete on master A as `salt-key` does them (both Salt lines), timed from
//! the final rename or unlink on A to the final file state on B and C; then
//! `salt-key -A` bursts of pending keys.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use keysync_tests::salt_ops::{delete_key, master_writes_pending, move_key, SaltLine};

use crate::cluster::BenchCluster;
use crate::report::{BulkRow, OpRow};
use crate::watch::{Final, PeerWatch};
use crate::Settings;

/// Longest wait for one operation to reach both peers before it counts as missed.
const OP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Live {
    pub ops: Vec<OpRow>,
    pub bulk: Vec<BulkRow>,
}

pub fn run(settings: &Settings, keys: &[String]) -> anyhow::Result<Live> {
    let mut cluster = BenchCluster::new(settings, "live")?;
    cluster.start_all()?;
    let watch = PeerWatch::new(&[cluster.pki(1), cluster.pki(2)])?;
    let a = cluster.pki(0).to_path_buf();

    let ids: Vec<String> = (0..settings.n_ops).map(|i| format!("lat{i:06}")).collect();
    let key_of = |i: usize| keys[i % keys.len()].as_bytes().to_vec();
    let line_of = |i: usize| [SaltLine::S3006, SaltLine::S3008][i % 2];
    write_pending(&cluster, std::slice::from_ref(&a), &ids, keys)?;

    let mut ops = Vec::new();
    for (kind, to) in [("accept", Some("minions")), ("reject", Some("minions_rejected")), ("delete", None)] {
        let mut samples: [Vec<Option<Duration>>; 2] = [Vec::new(), Vec::new()];
        for (i, id) in ids.iter().enumerate() {
            watch.drain();
            let want = match to {
                Some(folder) => {
                    move_key(line_of(i), &a, id, folder);
                    Final::In(folder, key_of(i))
                }
                None => {
                    delete_key(&a, id);
                    Final::Gone
                }
            };
            let t0 = Instant::now();
            samples[i % 2].extend(watch.wait_final(id, &want, t0, OP_TIMEOUT));
        }
        match to {
            // Salt's two lines delete alike (unlink in every folder).
            None => ops.push(OpRow::new(kind, "3006+3008", samples.concat())),
            Some(_) => {
                for (line, samples) in ["3006", "3008"].into_iter().zip(samples) {
                    ops.push(OpRow::new(kind, line, samples));
                }
            }
        }
    }

    let mut bulk = Vec::new();
    for (line, prefix) in [(SaltLine::S3006, "bulk6-"), (SaltLine::S3008, "bulk8-")] {
        let ids: Vec<String> = (0..settings.n_bulk).map(|i| format!("{prefix}{i:06}")).collect();
        // As on a multi-master site: each minion has sent its key to every
        // master, so every master holds it pending.
        write_pending(&cluster, &(0..3).map(|idx| cluster.pki(idx).to_path_buf()).collect::<Vec<_>>(), &ids, keys)?;
        watch.drain();
        let burst = Instant::now();
        for id in &ids {
            move_key(line, &a, id, "minions");
        }
        let t0 = Instant::now();
        let by_id = |id: &str| -> Final {
            let i: usize = id[prefix.len()..].parse().unwrap_or(0);
            Final::In("minions", key_of(i))
        };
        let per_peer = watch.wait_all(&ids, by_id, t0, Duration::from_secs(120));
        bulk.push(BulkRow::new(if line == SaltLine::S3006 { "3006" } else { "3008" }, ids.len(), t0 - burst, per_peer));
    }
    cluster.stop()?;
    Ok(Live { ops, bulk })
}

/// The master receiving minions' keys: pending files written in place on A,
/// then a wait until A's agent has read them all (each audited once as
/// `pending`), so the operations that follow are timed alone.
/// Writes `ids` pending into the first `pkis.len()` masters' folders as the
/// master does, and waits until their agents have audited them all.
pub(crate) fn write_pending(
    cluster: &BenchCluster,
    pkis: &[PathBuf],
    ids: &[String],
    keys: &[String],
) -> anyhow::Result<()> {
    let audits: Vec<&Path> = (0..pkis.len()).map(|idx| cluster.files[idx].audit_log.as_path()).collect();
    let before: Vec<usize> = audits.iter().map(|audit| count_pending(audit)).collect();
    for pki in pkis {
        for (i, id) in ids.iter().enumerate() {
            master_writes_pending(pki, id, &keys[i % keys.len()]);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60 + ids.len() as u64 / 100);
    for (audit, before) in audits.iter().zip(before) {
        while count_pending(audit) < before + ids.len() {
            if Instant::now() > deadline {
                bail!("an agent did not observe {} pending keys within the time; see {}", ids.len(), audit.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Lets the agents finish the audit burst before timing starts.
    std::thread::sleep(Duration::from_millis(200));
    // On a site the keys were pending for a while and the kernel has written
    // them back; here they were written a moment ago, and that writeback must
    // not land on the first timed syncfs (untimed, as after rsync in the join).
    std::process::Command::new("sync").status().context("cannot run sync")?;
    Ok(())
}

fn count_pending(audit: &Path) -> usize {
    std::fs::read_to_string(audit).map(|text| text.matches(r#""action":"pending""#).count()).unwrap_or(0)
}
