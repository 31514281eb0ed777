//! First contact on real agent processes: drifted masters whose agents start
//! in different orders end alike, by the rules of docs/adopting.md; an
//! identical site rewrites no file; observe mode writes nothing, `plan`
//! tells what normal mode then does, and it does exactly that; the
//! inventory's digest is the one docs/adopting.md's recipe recomputes.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use keysync_tests::binary::{run_cli, FaultCluster};
use keysync_tests::salt_ops::{new_public_key, path, stamps};
use keysync_tests::wait_until;

/// Identical on every master: must never be rewritten.
const N_SAME: usize = 100;

/// What each master (a, b, c) holds for an id at its agent's first start:
/// (folder, key) or nothing.
type Drift = [Option<(&'static str, usize)>; 3];

/// The drift table of issue 16: accepted vs rejected, accepted vs absent,
/// pending vs accepted, rejected vs pending, two keys, identical; and what
/// each master shows afterwards (folder and key, or no decided key).
fn table() -> Vec<(&'static str, Drift, Drift)> {
    let (a, r, p) = ("minions", "minions_rejected", "minions_pre");
    vec![
        ("acc-rej", [Some((a, 0)), Some((r, 0)), Some((a, 0))], [Some((r, 0)), Some((r, 0)), Some((r, 0))]),
        ("acc-abs", [Some((a, 0)), None, None], [Some((a, 0)), Some((a, 0)), Some((a, 0))]),
        ("pend-acc", [Some((p, 0)), Some((a, 0)), None], [Some((a, 0)), Some((a, 0)), Some((a, 0))]),
        ("rej-pend", [Some((r, 0)), Some((p, 0)), None], [Some((r, 0)), Some((r, 0)), Some((r, 0))]),
        // Two keys: each keeps its own; master-c, which held neither, trusts neither.
        ("two-keys", [Some((a, 0)), Some((a, 1)), None], [Some((a, 0)), Some((a, 1)), None]),
        ("same", [Some((a, 0)), Some((a, 0)), Some((a, 0))], [Some((a, 0)), Some((a, 0)), Some((a, 0))]),
    ]
}

/// Per id, two keys.
fn keys(ids: &[&str]) -> BTreeMap<String, [String; 2]> {
    ids.iter().map(|id| (id.to_string(), [new_public_key(), new_public_key()])).collect()
}

fn write(pki: &Path, folder: &str, id: &str, key: &str) {
    std::fs::write(path(pki, folder, id), key).unwrap();
}

/// The files each master holds at its first start: the table, and N_SAME
/// identical accepted keys.
fn prepare(idx: usize, pki: &Path, keys: &BTreeMap<String, [String; 2]>) {
    for (id, held, _) in table() {
        if let Some((folder, k)) = held[idx] {
            write(pki, folder, id, &keys[id][k]);
        }
    }
    for i in 0..N_SAME {
        let id = format!("same{i:03}");
        write(pki, "minions", &id, &keys[&id][0]);
    }
}

/// What a master's folders hold for `id`: the accepted or rejected key's
/// folder and index, `None` when neither (pending or nothing).
fn decided(pki: &Path, id: &str, keys: &BTreeMap<String, [String; 2]>) -> Option<(&'static str, usize)> {
    ["minions", "minions_rejected"].into_iter().find_map(|folder| {
        let bytes = std::fs::read_to_string(path(pki, folder, id)).ok()?;
        let k = keys[id].iter().position(|key| *key == bytes).expect("one of the id's keys");
        Some((folder, k))
    })
}

/// (inode, mtime) of every key file.
fn snapshot(pki: &Path) -> BTreeMap<String, (u64, i64, i64)> {
    stamps(pki).unwrap().into_iter().map(|(name, stamp)| (name, stamp.written)).collect()
}

fn all_ids() -> Vec<String> {
    table().iter().map(|(id, _, _)| id.to_string()).chain((0..N_SAME).map(|i| format!("same{i:03}"))).collect()
}

async fn cluster(root: &Path, keys: &BTreeMap<String, [String; 2]>, observe: bool) -> FaultCluster {
    FaultCluster::create(root, 3, |idx, files| {
        prepare(idx, &files.pki, keys);
        if observe {
            set_observe(&files.config_path, true);
        }
    })
    .await
}

/// Puts `mode = "observe"` at the top of a config file, or takes it out.
fn set_observe(config: &Path, on: bool) {
    let text = std::fs::read_to_string(config).unwrap();
    let text = text.strip_prefix("mode = \"observe\"\n").unwrap_or(&text).to_string();
    let text = if on { format!("mode = \"observe\"\n{text}") } else { text };
    std::fs::write(config, text).unwrap();
}

/// Waits until every master shows what the table says.
async fn settled(cluster: &FaultCluster, keys: &BTreeMap<String, [String; 2]>) {
    for (idx, files) in cluster.files.iter().enumerate() {
        let what = format!("master {idx} shows the table's outcome");
        wait_until(Duration::from_secs(30), &what, || {
            table().iter().all(|(id, _, after)| decided(&files.pki, id, keys) == after[idx])
        })
        .await;
    }
}

/// Starts the agents in `order`, each once the one before has started, in
/// normal mode; returns when the table has settled everywhere.
async fn adopt_in_order(order: [usize; 3]) -> Vec<(BTreeMap<String, (u64, i64, i64)>, Vec<String>)> {
    let root = tempfile::tempdir().unwrap();
    let ids: Vec<String> = all_ids();
    let keys = keys(&ids.iter().map(String::as_str).collect::<Vec<_>>());
    let mut cluster = cluster(root.path(), &keys, false).await;
    let before: Vec<_> = cluster.files.iter().map(|f| snapshot(&f.pki)).collect();
    let digests: Vec<String> = cluster.files.iter().map(|f| documented_digest(&f.pki)).collect();
    for idx in order {
        cluster.start(idx).await;
    }
    settled(&cluster, &keys).await;
    // A few anti-entropy rounds (1 s each) after it settled: still nothing more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    settled(&cluster, &keys).await;
    let mut out = Vec::new();
    for (idx, files) in cluster.files.iter().enumerate() {
        let after = snapshot(&files.pki);
        for i in 0..N_SAME {
            let file = format!("minions/same{i:03}");
            assert_eq!(after.get(&file), before[idx].get(&file), "master {idx}: {file} was rewritten");
        }
        let audit = salt_keysync::disk::audit::read_all(&files.audit_log).unwrap();
        let per_key = audit.iter().filter(|r| r.minion.as_deref().is_some_and(|m| m.starts_with("same"))).count();
        assert_eq!(per_key, 0, "master {idx}: no record per agreed key");
        let inventories: Vec<_> = audit.iter().filter(|r| r.action == "inventory").collect();
        assert_eq!(inventories.len(), 1, "master {idx}: one inventory");
        let reason = inventories[0].reason.as_deref().unwrap_or_default();
        assert!(
            reason.ends_with(&format!(" {}", digests[idx])),
            "master {idx}: {reason:?}, documented {}",
            digests[idx]
        );
        let two_keys = audit.iter().filter(|r| r.action == "conflict" && r.minion.as_deref() == Some("two-keys"));
        assert_eq!(two_keys.count(), 1, "master {idx}: the two keys told once");
        let told: Vec<String> = audit
            .iter()
            .filter(|r| r.minion.as_deref().is_some_and(|m| !m.starts_with("same")))
            .map(|r| format!("{} {} {}", r.minion.as_deref().unwrap(), r.action, r.outcome))
            .collect();
        out.push((after, told));
    }
    for idx in 0..3 {
        cluster.stop(idx);
    }
    out
}

/// The drift table, agents started a → b → c and c → b → a: the same outcome
/// (checked against the table in `settled`), no agreed file rewritten, and
/// every disagreement audited on each master it concerns: one whose
/// folders change, or whose decided key another master decided otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drifted_masters_end_alike_whatever_the_start_order() {
    for order in [[0, 1, 2], [2, 1, 0]] {
        let masters = adopt_in_order(order).await;
        for (idx, (_, told)) in masters.iter().enumerate() {
            for (id, held, after) in table() {
                let decided = |h: &Option<(&'static str, usize)>| h.filter(|(folder, _)| *folder != "minions_pre");
                let changes = decided(&held[idx]) != after[idx];
                let disputed = decided(&held[idx]).is_some()
                    && held.iter().any(|other| decided(other).is_some_and(|o| Some(o) != decided(&held[idx])));
                if changes || disputed {
                    let audited =
                        told.iter().any(|t| t.starts_with(&format!("{id} ")) && !t.ends_with("pending observed"));
                    assert!(audited, "order {order:?}, master {idx}: {id} not audited: {told:?}");
                }
            }
        }
    }
}

/// Observe mode writes nothing and `plan` shows every master's outcome;
/// switched to normal mode, the agents do exactly what it said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_then_plan_then_normal_mode_does_what_the_plan_said() {
    let root = tempfile::tempdir().unwrap();
    let ids: Vec<String> = all_ids();
    let keys = keys(&ids.iter().map(String::as_str).collect::<Vec<_>>());
    let mut cluster = cluster(root.path(), &keys, true).await;
    let before: Vec<_> = cluster.files.iter().map(|f| snapshot(&f.pki)).collect();
    cluster.start_all().await;
    let config = cluster.files[0].config_path.to_str().unwrap().to_string();
    // Once every master has learnt the others' claims, the plan names every
    // disputed id with its outcome. (Naming the id is not enough: master-c,
    // having learnt one of two-keys' claims, plans to accept it until it
    // learns the other; a CI run read the plan then.)
    let disputed: Vec<(&str, Drift)> = table()
        .into_iter()
        .filter(|(_, held, _)| held.iter().any(|h| *h != held[0]))
        .map(|(id, _, after)| (id, after))
        .collect();
    let state = |after: Option<(&str, usize)>| match after {
        Some(("minions", _)) => "accepted",
        Some(("minions_rejected", _)) => "rejected",
        _ => "nothing",
    };
    let mut plan = serde_json::Value::Null;
    wait_until(Duration::from_secs(30), "the plan names every disputed id's outcome on every master", || {
        let out = run_cli(&["plan", "--json", "--config", &config]);
        if !out.status.success() {
            return false;
        }
        plan = serde_json::from_slice(&out.stdout).unwrap();
        plan["masters"].as_array().unwrap().iter().enumerate().all(|(idx, m)| {
            m["error"].is_null()
                && m["observe"] == true
                && disputed.iter().all(|(id, after)| {
                    m["rows"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|r| r["minion"] == *id && r["will"]["state"] == state(after[idx]))
                })
        })
    })
    .await;
    let masters = plan["masters"].as_array().unwrap();
    assert_eq!(
        masters.iter().map(|m| m["node"].as_str().unwrap()).collect::<Vec<_>>(),
        ["master-a", "master-b", "master-c"]
    );
    let row =
        |m: usize, id: &str| masters[m]["rows"].as_array().unwrap().iter().find(|r| r["minion"] == id).unwrap().clone();
    assert_eq!(
        (row(0, "acc-rej")["holds"]["state"].clone(), row(0, "acc-rej")["will"]["state"].clone()),
        ("accepted".into(), "rejected".into())
    );
    assert_eq!(row(0, "acc-rej")["why"], "a rejection beats an acceptance of the same key");
    assert_eq!(row(1, "acc-rej")["will"]["state"], "rejected");
    assert_eq!(row(2, "two-keys")["will"]["state"], "nothing");
    assert!(row(0, "two-keys")["conflict"].as_bool().unwrap());
    assert!(
        masters.iter().all(|m| m["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| !r["minion"].as_str().unwrap().starts_with("same"))),
        "agreed ids are not in the plan"
    );
    let table_text = run_cli(&["plan", "--config", &config]);
    let text = String::from_utf8_lossy(&table_text.stdout);
    assert!(text.contains("CONFLICT") && text.contains("acc-rej"), "{text}");
    // Nothing written by observe mode, and no state kept.
    for (idx, files) in cluster.files.iter().enumerate() {
        assert_eq!(snapshot(&files.pki), before[idx], "master {idx}: observe mode wrote to the key folders");
    }
    for idx in 0..3 {
        cluster.stop(idx);
        set_observe(&cluster.files[idx].config_path, false);
        assert!(!cluster.files[idx].dir.join("state/state.redb").exists(), "master {idx}: observe mode kept no store");
    }
    // Normal mode: every master ends as the plan said.
    cluster.start_all().await;
    for (m, master) in masters.iter().enumerate() {
        for r in master["rows"].as_array().unwrap() {
            let id = r["minion"].as_str().unwrap().to_string();
            let will = r["will"].clone();
            let pki = cluster.files[m].pki.clone();
            let what = format!("{} shows {id} as the plan said: {will}", master["node"]);
            wait_until(Duration::from_secs(30), &what, || {
                let state = will["state"].as_str().unwrap();
                let shown = decided(&pki, &id, &keys);
                match state {
                    "accepted" | "rejected" => {
                        let folder = if state == "accepted" { "minions" } else { "minions_rejected" };
                        shown.is_some_and(|(f, k)| f == folder && fingerprint(&keys[&id][k]) == will["fingerprint"])
                    }
                    _ => shown.is_none(),
                }
            })
            .await;
        }
    }
    settled(&cluster, &keys).await;
    for idx in 0..3 {
        cluster.stop(idx);
    }
}

/// The inventory digest of `pki`'s folders as docs/adopting.md tells an
/// operator to recompute it: its marked shell block, run as written there
/// but in `pki` instead of /etc/salt/pki/master.
fn documented_digest(pki: &Path) -> String {
    let block = keysync_tests::docs::block("docs/adopting.md", "<!-- first-contact: inventory digest -->");
    let script = block.strip_prefix("cd /etc/salt/pki/master\n").expect("the recipe starts in the pki_dir");
    let out = Command::new("bash").args(["-euo", "pipefail", "-c", script]).current_dir(pki).output().unwrap();
    assert!(out.status.success(), "{script}\nfailed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().split_whitespace().next().expect("sha256sum's output").to_string()
}

/// The colon-hex sha256 of a key's bytes, as the plan shows it.
fn fingerprint(key: &str) -> serde_json::Value {
    salt_keysync::core::Fingerprint::of(key.as_bytes()).to_string().into()
}

/// The plan's rows for `id`, one per master in name order (the asked
/// agent's own comes first in the plan): (holds, will, conflict), or `None`
/// for a master that has no row for it.
fn plan_rows(plan: &serde_json::Value, id: &str) -> Vec<Option<(serde_json::Value, serde_json::Value, bool)>> {
    let mut masters: Vec<&serde_json::Value> = plan["masters"].as_array().unwrap().iter().collect();
    masters.sort_by_key(|m| m["node"].as_str().unwrap().to_string());
    masters
        .into_iter()
        .map(|m| {
            let row = m["rows"].as_array().unwrap().iter().find(|r| r["minion"] == id)?;
            Some((row["holds"].clone(), row["will"].clone(), row["conflict"].as_bool().unwrap()))
        })
        .collect()
}

fn shown(state: &str, key: Option<&str>) -> serde_json::Value {
    match key {
        Some(key) => serde_json::json!({ "state": state, "fingerprint": fingerprint(key) }),
        None => serde_json::json!({ "state": state }),
    }
}

/// Asks `config`'s agent for the plan until `want` holds (30 s at most);
/// panics with the last plan read.
async fn plan_until(config: &str, what: &str, want: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let started = std::time::Instant::now();
    let mut last = serde_json::Value::Null;
    while started.elapsed() < Duration::from_secs(30) {
        let out = run_cli(&["plan", "--json", "--config", config]);
        if out.status.success() {
            last = serde_json::from_slice(&out.stdout).unwrap();
            if want(&last) {
                return last;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what}: not within 30 s; the last plan:\n{last:#}");
}

/// Issue 28 item 6, docs/adopting.md step 4 as written: two keys held for
/// mail01 (master-a and master-b), a conflict in the plan; the operator
/// deletes master-b's key with salt-key and restarts master-b's agent. The
/// other observers had learnt master-b's old claim and brought it back, so
/// every master's plan still showed the conflict a minute later. Now the
/// plan on every master shows master-a's key accepted everywhere within a
/// few anti-entropy rounds (1 s here). And a master holding the key pending
/// says so in HOLDS, with its fingerprint (it said "nothing").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_removed_in_observe_mode_leaves_every_masters_plan() {
    let root = tempfile::tempdir().unwrap();
    let (k1, k2, k3) = (new_public_key(), new_public_key(), new_public_key());
    let mut cluster = FaultCluster::create(root.path(), 3, |idx, files| {
        match idx {
            0 => write(&files.pki, "minions", "mail01", &k1),
            1 => write(&files.pki, "minions", "mail01", &k2),
            _ => write(&files.pki, "minions_pre", "mail01", &k1),
        }
        if idx == 0 {
            write(&files.pki, "minions", "web01", &k3);
        } else if idx == 1 {
            write(&files.pki, "minions_pre", "web01", &k3);
        }
        set_observe(&files.config_path, true);
    })
    .await;
    cluster.start_all().await;
    let configs: Vec<String> = cluster.files.iter().map(|f| f.config_path.to_str().unwrap().to_string()).collect();
    let conflict = vec![
        Some((shown("accepted", Some(&k1)), shown("accepted", Some(&k1)), true)),
        Some((shown("accepted", Some(&k2)), shown("accepted", Some(&k2)), true)),
        Some((shown("pending", Some(&k1)), shown("pending", Some(&k1)), true)),
    ];
    for config in &configs {
        let plan =
            plan_until(config, "mail01's conflict on every master", |plan| plan_rows(plan, "mail01") == conflict).await;
        // A key pending where another master accepted it: HOLDS says pending.
        assert_eq!(
            plan_rows(&plan, "web01")[1],
            Some((shown("pending", Some(&k3)), shown("accepted", Some(&k3)), false)),
            "{plan:#}"
        );
    }

    // Step 4: `salt-key -d mail01 -y` on master-b, and its agent restarted.
    std::fs::remove_file(path(&cluster.files[1].pki, "minions", "mail01")).unwrap();
    cluster.stop(1);
    cluster.start(1).await;
    let settled = vec![
        Some((shown("accepted", Some(&k1)), shown("accepted", Some(&k1)), false)),
        Some((shown("nothing", None), shown("accepted", Some(&k1)), false)),
        Some((shown("pending", Some(&k1)), shown("accepted", Some(&k1)), false)),
    ];
    for config in &configs {
        let what = format!("{config}: mail01 no longer in conflict, master-a's key everywhere");
        plan_until(config, &what, |plan| plan_rows(plan, "mail01") == settled).await;
    }
    cluster.stop_all();
}
