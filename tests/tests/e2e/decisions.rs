//! Issue 3, scenarios 1–3: one `salt-key` on one master; Salt on every master
//! follows.

use std::time::Duration;

use keysync_tests::salt::SaltCluster;

/// How long a minion may take to submit its key to a master after it started
/// (Python start-up on a loaded machine, then one auth per master).
const SUBMIT: Duration = Duration::from_secs(90);
/// Replication between agents: milliseconds normally; generous on a shared machine.
const REPLICATE: Duration = Duration::from_secs(20);
/// A minion's auth retry (acceptance_wait_time 1–2 s) plus a `salt` run.
const ANSWER: Duration = Duration::from_secs(90);

/// Scenario 1: `salt-key -a m1` on A; `salt m1 test.ping` answers True from A, B and C.
pub fn accept_on_a_answers_everywhere(c: &mut SaltCluster) {
    c.wait_folder_everywhere("m1", Some("minions_pre"), SUBMIT);
    c.masters[0].salt_key(&["-a", "m1"]);
    c.wait_folder_everywhere("m1", Some("minions"), REPLICATE);
    let key_on_a = std::fs::read(c.masters[0].pki.join("minions/m1")).unwrap();
    for master in &c.masters[1..] {
        let key = std::fs::read(master.pki.join("minions/m1")).unwrap();
        assert_eq!(key, key_on_a, "m1's key on {} differs from A's", master.id);
    }
    c.assert_listed_everywhere("m1", "accepted");
    for i in 0..3 {
        c.wait_answers(i, "m1", ANSWER);
    }
}

/// Scenario 2: `salt-key -r m2` on B; `salt-key -L` on A and C lists m2 as rejected.
pub fn reject_on_b_listed_everywhere(c: &mut SaltCluster) {
    c.wait_folder_everywhere("m2", Some("minions_pre"), SUBMIT);
    // Stopped first, as in scenario 3: its auth retry can meet `salt-key -r`
    // in Salt's own race and have its key placed in pending again (seen in
    // CI: "New public key for m2 placed in pending" in the millisecond of
    // the reject on B, which Salt then never rejected).
    c.minion("m2").stop();
    c.masters[1].salt_key(&["-r", "m2"]);
    c.wait_folder_everywhere("m2", Some("minions_rejected"), REPLICATE);
    c.assert_listed_everywhere("m2", "rejected");
    c.minion("m2").start();
}

/// Scenario 3: `salt-key -d m1` on C: gone from every master. The restarted minion
/// submits its key again and it is pending on every master (each master got
/// it from the minion: pending keys are not replicated).
pub fn delete_on_c_then_pending_again(c: &mut SaltCluster) {
    // Stopped first, so that its re-submission cannot race the check that
    // the key is gone.
    c.minion("m1").stop();
    c.masters[2].salt_key(&["-d", "m1"]);
    c.wait_folder_everywhere("m1", None, REPLICATE);
    c.assert_listed_everywhere("m1", "absent");
    c.minion("m1").start();
    c.wait_folder_everywhere("m1", Some("minions_pre"), SUBMIT);
    c.assert_listed_everywhere("m1", "pending");
    // The pending key on each master is the minion's own key.
    let own = c.minion("m1").public_key().expect("m1 has a minion.pub");
    for master in &c.masters {
        let pending = std::fs::read_to_string(master.pki.join("minions_pre/m1")).unwrap();
        assert_eq!(pending.trim_end(), own.trim_end(), "pending m1 on {}", master.id);
    }
}
