//! Issue 17: `salt-key -D -y` on one master is held by the other masters'
//! blast-radius guard (every key kept, no `.dfn` dropped); `held` lists it,
//! `revert` brings the keys back on the origin; a second mass delete is
//! then `release`d on each master that holds it. (Deleting ten keys at once is not
//! held: scenario 5 deletes ten on A and they reach B.)

use std::collections::BTreeSet;
use std::time::Duration;

use keysync_tests::salt::{wait_for, SaltCluster};

/// The ids accepted on `master`.
fn accepted(c: &SaltCluster, master: usize) -> BTreeSet<String> {
    let dir = c.masters[master].pki.join("minions");
    std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

/// What `salt-keysync held --json` says on `master`: the held ids.
fn held(c: &SaltCluster, master: usize) -> BTreeSet<String> {
    let list: serde_json::Value = serde_json::from_str(&c.keysync(master, &["held", "--json"])).unwrap();
    list["held"].as_array().unwrap().iter().map(|h| h["minion"].as_str().unwrap().to_string()).collect()
}

/// `.dfn` on `master`: (present, its inode) — an agent that drops one changes it.
fn dfn(c: &SaltCluster, master: usize) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(c.masters[master].dfn()).ok().map(|m| m.ino())
}

/// Waits until `master`'s guard holds every id of `want`.
fn wait_held(c: &SaltCluster, master: usize, want: &BTreeSet<String>) {
    wait_for(Duration::from_secs(60), Duration::from_millis(200), &format!("held on {}", c.masters[master].id), || {
        let now = held(c, master);
        if want.is_subset(&now) {
            Ok(())
        } else {
            Err(format!("{} of {} held", want.intersection(&now).count(), want.len()))
        }
    });
}

/// Waits until A holds `keys` accepted again and B and C hold nothing (a
/// revert reached every master).
fn wait_reverted(c: &SaltCluster, keys: &BTreeSet<String>) {
    wait_for(Duration::from_secs(60), Duration::from_millis(200), "keys back on A", || {
        let now = accepted(c, 0);
        if now == *keys {
            Ok(())
        } else {
            Err(format!("{} of {} back", now.len(), keys.len()))
        }
    });
    for master in [1, 2] {
        wait_for(Duration::from_secs(30), Duration::from_millis(200), "nothing held", || {
            let now = held(c, master);
            if now.is_empty() {
                Ok(())
            } else {
                Err(format!("{} held", now.len()))
            }
        });
    }
}

/// `salt-key -D -y` on A: B and C keep every key and drop no `.dfn`, say
/// why in `status`, and `revert` on B restores every key on A.
pub fn mass_delete_on_a_is_held_and_reverted(c: &mut SaltCluster) {
    let before = accepted(c, 0);
    assert!(before.len() >= 150, "the bulk keys are accepted: {}", before.len());
    assert_eq!(accepted(c, 1), before, "B agrees with A before");
    // A `.dfn` the previous scenario dropped (C catching up on deletes) is
    // consumed by its salt-master first: taken for one of this scenario's,
    // or its consumption for a change, it failed this test once in CI.
    for master in [1, 2] {
        wait_for(Duration::from_secs(60), Duration::from_millis(100), "earlier .dfn consumed", || {
            match dfn(c, master) {
                None => Ok(()),
                Some(_) => Err(format!("{} still has a .dfn", c.masters[master].id)),
            }
        });
    }
    let dfn_before = [dfn(c, 1), dfn(c, 2)];
    c.masters[0].salt_key(&["-D"]);
    assert!(accepted(c, 0).is_empty(), "salt-key -D removed every key on A");
    // Scenario 5 deleted ten keys on A seconds ago, within the guard's
    // window: part of this burst, they are put back and held with it.
    let mut whole = before.clone();
    for master in [1, 2] {
        wait_held(c, master, &before);
        let held = held(c, master);
        assert_eq!(accepted(c, master), held, "{} keeps every key it holds", c.masters[master].id);
        assert!(held.len() <= before.len() + 10, "{} held only this burst: {}", c.masters[master].id, held.len());
        whole.extend(held);
    }
    assert_eq!([dfn(c, 1), dfn(c, 2)], dfn_before, "no .dfn dropped on B or C: nothing was revoked there");
    let held_b = held(c, 1);
    let n_held = held_b.len();
    let (code, status, _) = c.keysync_exit(1, &["status"]);
    assert!(status.contains(&format!("HELD DELETES: {n_held} from master-a")), "{status}");
    assert_eq!(code, Some(3), "held deletes are an error finding: {status}");
    let text = c.keysync(1, &["revert", "-y", "--origin", "master-a"]);
    assert!(text.starts_with(&format!("{n_held} reverted")), "{text}");
    // C may have put back scenario 5's deletes where B, which had them
    // longer ago, did not: what B's revert left held on C is reverted there.
    wait_for(Duration::from_secs(30), Duration::from_millis(200), "B's revert settled on C", || {
        let left: BTreeSet<String> = held(c, 2).intersection(&held_b).cloned().collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{} still held on C", left.len()))
        }
    });
    if !held(c, 2).is_empty() {
        c.keysync(2, &["revert", "-y", "--origin", "master-a"]);
    }
    let before = whole;
    wait_reverted(c, &before);
    let list = c.masters[0].list();
    assert!(before.is_subset(&list.accepted), "salt-key -L on A lists them accepted again");
}

/// A second `salt-key -D -y` on A, held again, then `release`d on C: the
/// keys leave C; B, whose guard held them too, holds C's release as C's
/// mass delete (nothing a peer sends releases what a guard holds) until B's
/// operator releases it; then the keys have left every master.
pub fn mass_delete_released_goes_everywhere(c: &mut SaltCluster) {
    let before = accepted(c, 0);
    c.masters[0].salt_key(&["-D"]);
    wait_held(c, 1, &before);
    wait_held(c, 2, &before);
    let text = c.keysync(2, &["release", "-y", "--origin", "master-a"]);
    assert!(text.starts_with(&format!("{} released", before.len())), "{text}");
    wait_for(Duration::from_secs(60), Duration::from_millis(200), "C's release held on B", || {
        let list: serde_json::Value = serde_json::from_str(&c.keysync(1, &["held", "--json"])).unwrap();
        let from_c = list["held"].as_array().unwrap().iter().filter(|h| h["origin"] == "master-c").count();
        if from_c == before.len() {
            Ok(())
        } else {
            Err(format!("{from_c} of {} held as master-c's", before.len()))
        }
    });
    assert_eq!(accepted(c, 1), before, "B keeps every key: C's release is no release on B");
    let text = c.keysync(1, &["release", "-y", "--origin", "master-c"]);
    assert!(text.starts_with(&format!("{} released", before.len())), "{text}");
    for master in 0..3 {
        wait_for(Duration::from_secs(60), Duration::from_millis(200), "released everywhere", || {
            let left: BTreeSet<String> = accepted(c, master).intersection(&before).cloned().collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{} left on {}", left.len(), c.masters[master].id))
            }
        });
    }
    assert!(held(c, 1).is_empty() && held(c, 2).is_empty(), "nothing held on B or C");
}

/// Keys put on every master for scenario 8: the first of the bulk keys.
const N_SLOW: usize = 12;

/// Issue 28: `salt-key -D -y` on A while its salt-master is stopped deletes
/// about one key a second (each waits on the event bus), so every delete
/// passes the guard's `quiet` on its own. B and C still end up holding the
/// whole burst with every key in place (the first ones put back from what
/// they kept), and one `revert` on B brings every key back on A.
pub fn slow_mass_delete_with_master_stopped_is_held_whole(c: &mut SaltCluster) {
    let (dir, ids) = c.bulk_keys();
    let slow: Vec<String> = ids.into_iter().take(N_SLOW).collect();
    for id in &slow {
        let key = std::fs::read(dir.join(format!("{id}.pub"))).unwrap();
        keysync_tests::salt::write_file(&c.masters[0].pki.join("minions_pre").join(id), &key, 0o644);
    }
    c.masters[0].salt_key(&["-A"]);
    let before = accepted(c, 0);
    assert!(slow.iter().all(|id| before.contains(id)), "the keys are accepted on A: {before:?}");
    for master in [1, 2] {
        wait_for(Duration::from_secs(60), Duration::from_millis(200), "accepted everywhere", || {
            let there = accepted(c, master);
            if there == before {
                Ok(())
            } else {
                Err(format!("{} of {} on {}", there.intersection(&before).count(), before.len(), c.masters[master].id))
            }
        });
    }
    // The audit records of this scenario are those after these.
    let records_before: Vec<usize> =
        [1, 2].iter().map(|&m| c.keysync(m, &["audit", "--json"]).lines().count()).collect();
    c.masters[0].stop();
    let started = std::time::Instant::now();
    c.masters[0].salt_key(&["-D"]);
    let took = started.elapsed();
    assert!(accepted(c, 0).is_empty(), "salt-key -D removed every key on A");
    // What makes this scenario: slower than the guard's one quiet second per key.
    assert!(
        took >= Duration::from_millis(800) * (before.len() as u32 - 1),
        "salt-key -D of {} keys with salt-master stopped took {took:?}: not one key a second",
        before.len()
    );
    for master in [1, 2] {
        wait_held(c, master, &before);
        assert_eq!(accepted(c, master), before, "{} has every key, the first ones put back", c.masters[master].id);
        // Each delete this master let through was put back, and says so.
        // (While A's link is still held from scenario 6's mass delete,
        // within the guard's window, the whole burst is held from its first
        // delete and nothing is let through: a count of put-backs over the
        // whole log only passed on earlier scenarios' records.)
        let audit = c.keysync(master, &["audit", "--json"]);
        let now: Vec<&str> = audit.lines().skip(records_before[master - 1]).collect();
        let of = |id: &str, outcome: &str| {
            let (minion, outcome) = (format!("\"minion\":\"{id}\""), format!("\"outcome\":\"{outcome}\""));
            now.iter().any(|l| l.contains("\"action\":\"delete\"") && l.contains(&minion) && l.contains(&outcome))
        };
        for id in &slow {
            assert!(
                !of(id, "applied") || of(id, "put-back"),
                "{} let A's delete of {id} through and did not tell it put back:\n{}",
                c.masters[master].id,
                now.join("\n")
            );
        }
    }
    let text = c.keysync(1, &["revert", "-y", "--origin", "master-a"]);
    assert!(text.starts_with(&format!("{} reverted", before.len())), "{text}");
    wait_reverted(c, &before);
    for master in [1, 2] {
        assert_eq!(accepted(c, master), before, "{} keeps every key", c.masters[master].id);
    }
    c.masters[0].start();
    c.masters[0].wait_ready();
}
