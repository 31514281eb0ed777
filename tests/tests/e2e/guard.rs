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
    for master in [1, 2] {
        wait_held(c, master, &before);
        assert_eq!(accepted(c, master), before, "{} keeps every key", c.masters[master].id);
    }
    assert_eq!([dfn(c, 1), dfn(c, 2)], dfn_before, "no .dfn dropped on B or C: nothing was revoked there");
    let status = c.keysync(1, &["status"]);
    assert!(status.contains(&format!("HELD DELETES: {} from master-a", before.len())), "{status}");
    let text = c.keysync(1, &["revert", "--origin", "master-a"]);
    assert!(text.starts_with(&format!("{} reverted", before.len())), "{text}");
    wait_for(Duration::from_secs(60), Duration::from_millis(200), "keys back on A", || {
        let now = accepted(c, 0);
        if now == before {
            Ok(())
        } else {
            Err(format!("{} of {} back", now.len(), before.len()))
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
    let text = c.keysync(2, &["release", "--origin", "master-a"]);
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
    let text = c.keysync(1, &["release", "--origin", "master-c"]);
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
