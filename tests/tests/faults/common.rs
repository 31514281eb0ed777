//! Helpers shared by the fault tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use keysync_tests::binary::FaultCluster;
use salt_keysync::disk::audit::{read_verified, Record};

/// One fault test at a time: each runs three agents and some (the 5,000-key
/// burst, the soak) load the disk enough that a neighbour's `syncfs` takes
/// seconds, which would turn the timing of another test's scenario into luck.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What the decided folders say: id → (folder, key bytes), for `minions` and
/// `minions_rejected` (pending keys are per master and not compared).
pub type Decided = BTreeMap<String, (&'static str, Vec<u8>)>;

pub fn decided(pki: &Path) -> Decided {
    let mut out = Decided::new();
    for folder in ["minions", "minions_rejected"] {
        let Ok(dir) = std::fs::read_dir(pki.join(folder)) else { continue };
        for dirent in dir.flatten() {
            let name = dirent.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            if let Ok(bytes) = std::fs::read(dirent.path()) {
                // An id in both folders is a divergence the comparison must see.
                let key = if out.contains_key(&name) { format!("{name} (twice)") } else { name };
                out.insert(key, (folder, bytes));
            }
        }
    }
    out
}

/// Ids on which the agents' decided folders differ.
pub fn divergent(cluster: &FaultCluster) -> BTreeSet<String> {
    let states: Vec<Decided> = cluster.files.iter().map(|f| decided(&f.pki)).collect();
    let ids: BTreeSet<&String> = states.iter().flat_map(|s| s.keys()).collect();
    ids.into_iter().filter(|id| states.iter().any(|s| s.get(*id) != states[0].get(*id))).cloned().collect()
}

/// What an operator does where the blast-radius guard holds deletes: runs
/// `salt-keysync release` (the real CLI, over the control socket) on every
/// running master. Returns how many deletes were released.
pub async fn release_held(cluster: &FaultCluster) -> usize {
    let mut released = 0;
    for idx in 0..cluster.len() {
        if !cluster.is_running(idx) {
            continue;
        }
        let config = cluster.files[idx].config_path.to_str().unwrap().to_string();
        let out = tokio::task::spawn_blocking(move || {
            keysync_tests::binary::run_cli(&["release", "-y", "--json", "--config", &config])
        })
        .await
        .unwrap();
        // Nothing held there is an error the operator may get: fine here.
        if let Ok(reply) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
            released += reply["done"].as_array().map_or(0, Vec::len);
        }
    }
    released
}

/// [`converged`], with an operator releasing what the guard holds every two
/// seconds meanwhile (what is held may also be settled by newer decisions
/// first, so how much gets released depends on timing). Returns how many
/// deletes were released.
pub async fn converged_releasing(cluster: &FaultCluster, timeout: Duration) -> usize {
    let start = std::time::Instant::now();
    let mut released = 0;
    while !divergent(cluster).is_empty() && start.elapsed() < timeout {
        released += release_held(cluster).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    converged(cluster, Duration::from_secs(1)).await;
    released
}

/// Waits until every agent's decided folders are identical.
pub async fn converged(cluster: &FaultCluster, timeout: Duration) {
    let start = std::time::Instant::now();
    loop {
        let differ = divergent(cluster);
        if differ.is_empty() {
            return;
        }
        if start.elapsed() > timeout {
            let sample: Vec<_> = differ.iter().take(10).collect();
            panic!("not converged after {timeout:?}: {} ids differ, e.g. {sample:?}", differ.len());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Agent `idx`'s audit log with its hash chain verified.
pub fn audit(cluster: &FaultCluster, idx: usize) -> Vec<Record> {
    read_verified(&cluster.files[idx].audit_log).unwrap()
}

/// Agent `idx`'s audit records with this action and outcome.
pub fn audited(cluster: &FaultCluster, idx: usize, action: &str, outcome: &str) -> Vec<Record> {
    audit(cluster, idx).into_iter().filter(|r| r.action == action && r.outcome == outcome).collect()
}

/// Panics if any agent's audit shows a decision of one of `actions`
/// (e.g. a delete nobody made).
pub fn assert_no_decision(cluster: &FaultCluster, actions: &[&str]) {
    for idx in 0..cluster.len() {
        for record in audit(cluster, idx) {
            assert!(
                !(actions.contains(&record.action.as_str()) && record.outcome == "applied"),
                "{}: a {} no operator made: {record:?}",
                cluster.files[idx].name,
                record.action
            );
        }
    }
}

/// A version as the audit log prints it (`millis.logical@node`), in the
/// agents' order.
pub fn version_key(text: &str) -> (u64, u64, String) {
    let (clock, node) = text.split_once('@').unwrap_or((text, ""));
    let (millis, logical) = clock.split_once('.').unwrap_or((clock, "0"));
    (millis.parse().unwrap_or(0), logical.parse().unwrap_or(0), node.to_string())
}

/// For each id, the applied decision with the highest version in any audit
/// log: (action, fingerprint). The version rule says this is what every
/// master must end with.
pub fn winners(cluster: &FaultCluster) -> BTreeMap<String, (String, Option<String>)> {
    type Best = ((u64, u64, String), String, Option<String>);
    let mut best: BTreeMap<String, Best> = BTreeMap::new();
    for idx in 0..cluster.len() {
        for r in audit(cluster, idx) {
            let decision = matches!(r.action.as_str(), "accept" | "reject" | "delete");
            let (Some(minion), Some(version), true, "applied") = (&r.minion, &r.version, decision, r.outcome.as_str())
            else {
                continue;
            };
            let key = version_key(version);
            if best.get(minion).is_none_or(|(held, _, _)| *held < key) {
                best.insert(minion.clone(), (key, r.action.clone(), r.fingerprint.clone()));
            }
        }
    }
    best.into_iter().map(|(id, (_, action, fp))| (id, (action, fp))).collect()
}

/// Asserts that agent `idx`'s folders say what the highest versions in the
/// audit logs say, for every id decided anywhere.
pub fn assert_winners_applied(cluster: &FaultCluster, idx: usize) {
    let state = decided(&cluster.files[idx].pki);
    let winners = winners(cluster);
    for id in state.keys() {
        assert!(winners.contains_key(id), "{}: {id} is decided on disk but in no audit log", cluster.files[idx].name);
    }
    for (id, (action, fingerprint)) in winners {
        let want = match action.as_str() {
            "accept" => Some("minions"),
            "reject" => Some("minions_rejected"),
            _ => None,
        };
        let got = state.get(&id).map(|(folder, _)| *folder);
        assert_eq!(
            got, want,
            "{}: {id} should be {action} (highest version in the audit logs)",
            cluster.files[idx].name
        );
        if let (Some((_, bytes)), Some(fp)) = (state.get(&id), fingerprint) {
            assert_eq!(&fingerprint_of(bytes), &fp, "{}: {id} holds another key", cluster.files[idx].name);
        }
    }
}

/// sha256, colon-hex, as the audit log writes fingerprints.
pub fn fingerprint_of(bytes: &[u8]) -> String {
    salt_keysync::core::PublicKey::new(bytes).fingerprint().to_string()
}

/// `n` distinct real public keys (key generation is the slow part of big bursts).
pub fn key_pool(n: usize) -> Vec<String> {
    (0..n).map(|_| keysync_tests::salt_ops::new_public_key()).collect()
}

/// Writes pending keys straight into `pki/minions_pre` (as if they arrived
/// before the agent started).
pub fn write_pending(pki: &Path, ids: impl IntoIterator<Item = String>, keys: &[String]) {
    for (i, id) in ids.into_iter().enumerate() {
        std::fs::write(pki.join("minions_pre").join(id), &keys[i % keys.len()]).unwrap();
    }
}

/// Serves the agent's metrics on `addr`.
pub fn with_metrics(f: &keysync_tests::cluster::AgentFiles, addr: std::net::SocketAddr) {
    let text = std::fs::read_to_string(&f.config_path).unwrap();
    keysync_tests::probe::write_private(&f.config_path, &format!("metrics_listen = \"{addr}\"\n{text}"));
}

/// Appends `line` to the `[timings]` table of an agent's config.
pub fn add_timing(config: &Path, line: &str) {
    let text = std::fs::read_to_string(config).unwrap();
    std::fs::write(config, text.replace("[timings]\n", &format!("[timings]\n{line}\n"))).unwrap();
}

pub fn count(pki: &Path, folder: &str) -> usize {
    std::fs::read_dir(pki.join(folder))
        .map(|d| d.flatten().filter(|e| !e.file_name().to_string_lossy().starts_with('.')).count())
        .unwrap_or(0)
}

/// Three agents, started by the test: master-a and master-b agreeing on `n`
/// accepted keys, master-c empty (a joiner).
pub async fn two_agreeing_and_a_joiner(root: &Path, n: usize) -> FaultCluster {
    let keys = key_pool(8);
    FaultCluster::create(root, 3, |idx, f| {
        if idx < 2 {
            for i in 0..n {
                std::fs::write(f.pki.join("minions").join(format!("web{i:04}")), &keys[i % keys.len()]).unwrap();
            }
        }
    })
    .await
}

/// Waits until agent `idx` (run with `SALT_KEYSYNC_FAULT_FETCH_DELAY_MS`)
/// holds a fetch's answer.
pub async fn holding_a_fetch(cluster: &FaultCluster, idx: usize) {
    let log = cluster.log(idx);
    keysync_tests::wait_until(Duration::from_secs(60), "a fetch held", || {
        std::fs::read_to_string(&log).unwrap_or_default().contains("holding a fetch's answer")
    })
    .await;
}
