//! Issue 3, scenarios 4 and 5: many keys at once, and a master whose agent
//! was down while decisions were made elsewhere.

use std::collections::BTreeSet;
use std::time::Duration;

use keysync_tests::salt::{wait_for, write_file, SaltCluster};

/// Scenario 4: 200 keys made with Salt's own generator are pending on all three masters
/// (written into `minions_pre/`, as if each minion had submitted it to every
/// master); `salt-key -A -y` on B; every master lists all 200 as accepted.
pub fn accept_all_200_on_b(c: &mut SaltCluster) {
    let (dir, ids) = c.bulk_keys();
    for master in &c.masters {
        for id in &ids {
            let key = std::fs::read(dir.join(format!("{id}.pub"))).unwrap();
            write_file(&master.pki.join("minions_pre").join(id), &key, 0o644);
        }
    }
    c.masters[1].salt_key(&["-A"]);
    for master in &c.masters {
        wait_for(
            Duration::from_secs(60),
            Duration::from_millis(100),
            &format!("200 accepted on {}", master.id),
            || {
                let missing: Vec<&String> = ids.iter().filter(|id| master.folder_of(id) != Some("minions")).collect();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{} not accepted yet, e.g. {:?}", missing.len(), missing[0]))
                }
            },
        );
        let list = master.list();
        let want: BTreeSet<String> = ids.iter().cloned().collect();
        assert!(
            want.is_subset(&list.accepted),
            "salt-key -L on {} misses {:?}",
            master.id,
            want.difference(&list.accepted).collect::<Vec<_>>()
        );
        for id in &ids {
            let on_disk = std::fs::read(master.pki.join("minions").join(id)).unwrap();
            let made = std::fs::read(dir.join(format!("{id}.pub"))).unwrap();
            assert_eq!(on_disk, made, "{id}'s key bytes on {}", master.id);
        }
    }
    // On A and C the agents put the keys in place: with the mode this Salt
    // line's own salt-key gives them (3008: 0600, earlier lines: 0644),
    // learnt from `salt-master --version`.
    let want = if c.version.starts_with("3008") { 0o600 } else { 0o644 };
    for master in [&c.masters[0], &c.masters[2]] {
        use std::os::unix::fs::PermissionsExt;
        for id in &ids {
            let mode = std::fs::metadata(master.pki.join("minions").join(id)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, want, "{id} on {} (Salt {})", master.id, c.version);
        }
    }
}

/// Scenario 5: C's agent is stopped; on A ten keys are deleted and one rejected, on B
/// five new keys are accepted. C's folders still show the old state; when its
/// agent starts again, `salt-key -L` on C matches A and B.
pub fn stopped_agent_catches_up(c: &mut SaltCluster) {
    let (dir, ids) = c.bulk_keys();
    c.stop_agent(2);
    let late: Vec<String> = (0..5).map(|k| format!("late-{k}")).collect();
    for master in &c.masters {
        for (k, id) in late.iter().enumerate() {
            let key = std::fs::read(dir.join(format!("{}.pub", ids[k]))).unwrap();
            write_file(&master.pki.join("minions_pre").join(id), &key, 0o644);
        }
    }
    let deleted: Vec<&String> = ids.iter().filter(|id| id.starts_with("bulk-00")).collect();
    assert_eq!(deleted.len(), 10);
    c.masters[0].salt_key(&["-d", "bulk-00*"]);
    c.masters[0].salt_key(&["-r", "bulk-100", "--include-accepted"]);
    c.masters[1].salt_key(&["-a", "late-*"]);

    // A and B agree; C, without its agent, still has the old state.
    let a_and_b = |id: &str, folder: Option<&str>| {
        for master in &c.masters[..2] {
            wait_for(Duration::from_secs(30), Duration::from_millis(50), &format!("{id} on {}", master.id), || {
                let now = master.folder_of(id);
                if now == folder {
                    Ok(())
                } else {
                    Err(format!("{now:?}"))
                }
            });
        }
    };
    for id in &deleted {
        a_and_b(id, None);
    }
    a_and_b("bulk-100", Some("minions_rejected"));
    for id in &late {
        a_and_b(id, Some("minions"));
    }
    let stale = &c.masters[2];
    assert_eq!(stale.folder_of(deleted[0]), Some("minions"), "C changed without its agent");
    assert_eq!(stale.folder_of("late-0"), Some("minions_pre"), "C changed without its agent");
    let list_a = c.masters[0].list();
    assert_ne!(stale.list(), list_a, "C already matches A before its agent runs");

    c.start_agent(2);
    let stale = &c.masters[2];
    wait_for(Duration::from_secs(60), Duration::from_millis(100), "C caught up", || {
        let behind: Vec<String> = deleted
            .iter()
            .filter(|id| stale.folder_of(id).is_some())
            .map(|id| id.to_string())
            .chain((stale.folder_of("bulk-100") != Some("minions_rejected")).then(|| "bulk-100".to_string()))
            .chain(late.iter().filter(|id| stale.folder_of(id) != Some("minions")).cloned())
            .collect();
        if behind.is_empty() {
            Ok(())
        } else {
            Err(format!("still behind on {behind:?}"))
        }
    });
    let lists: Vec<_> = c.masters.iter().map(|m| m.list()).collect();
    assert_eq!(lists[2], lists[0], "salt-key -L on C vs A");
    assert_eq!(lists[1], lists[0], "salt-key -L on B vs A");
}
