//! Issue 28 item 2: what the blast-radius guard holds, and what was refused,
//! is visible on every master. The master whose mass delete is held hears
//! it from the peers holding it (their own claim); `status --cluster` on
//! every master lists held deletes and refused decisions as findings;
//! `status` exits 3 while a finding is an error; `release` and `revert`
//! show what they will do and ask first (`-y`, `--dry-run`).

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use keysync_proto::v1;
use keysync_tests::binary::{run_cli, ProcessCluster};
use keysync_tests::cluster::TestCluster;
use keysync_tests::probe::write_private;
use keysync_tests::salt_ops::{delete_key, master_writes_pending, move_key, new_public_key, path, SaltLine};
use serde_json::Value;

use crate::security::{hello_as, identity, now_hlc, peer_client, wire_accept};

const WAIT: Duration = Duration::from_secs(30);

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `salt-keysync ARGS --config CONFIG`, off the runtime's threads.
async fn cli(config: &Path, args: &[&str]) -> Output {
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    all.extend(["--config".to_string(), config.to_str().unwrap().to_string()]);
    tokio::task::spawn_blocking(move || run_cli(&all.iter().map(String::as_str).collect::<Vec<_>>())).await.unwrap()
}

/// `salt-keysync ARGS --config CONFIG` with a terminal (a pseudo-terminal)
/// as its stdin, on which `answer` is typed.
async fn at_terminal(config: &Path, args: &[&str], answer: &str) -> Output {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    use std::io::Write;
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    all.extend(["--config".to_string(), config.to_str().unwrap().to_string()]);
    let answer = answer.to_string();
    tokio::task::spawn_blocking(move || {
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
        grantpt(&master).unwrap();
        unlockpt(&master).unwrap();
        let name = ptsname(&master, Vec::new()).unwrap();
        let terminal = std::fs::OpenOptions::new().read(true).write(true).open(name.to_str().unwrap()).unwrap();
        // Typed before it asks: the terminal keeps the line until it is read.
        let mut typing = std::fs::File::from(master);
        typing.write_all(answer.as_bytes()).unwrap();
        let out =
            std::process::Command::new(keysync_tests::binary::binary()).args(&all).stdin(terminal).output().unwrap();
        drop(typing);
        out
    })
    .await
    .unwrap()
}

/// A JSON report (`status --json`, `status --cluster --json`) and the exit
/// status it came with, which must be 3 exactly when a finding is an error
/// (2 is every command's for wrong arguments).
async fn report(config: &Path, args: &[&str]) -> Result<(Value, i32), String> {
    let out = cli(config, args).await;
    let code = out.status.code().unwrap_or(-1);
    let Ok(report) = serde_json::from_slice::<Value>(&out.stdout) else {
        return Err(format!("exit {code}: {}{}", text(&out.stdout), text(&out.stderr)));
    };
    if report.get("error").is_some() {
        return Err(format!("exit {code}: {report}"));
    }
    let errors = findings(&report).iter().any(|f| f["level"] == "error");
    assert_eq!(code, if errors { 3 } else { 0 }, "{args:?}: exit 3 exactly when a finding is an error: {report:#}");
    Ok((report, code))
}

fn findings(report: &Value) -> Vec<Value> {
    report["findings"].as_array().cloned().unwrap_or_default()
}

/// The findings of `kind` in `report`.
fn of_kind(report: &Value, kind: &str) -> Vec<Value> {
    findings(report).into_iter().filter(|f| f["kind"] == kind).collect()
}

/// Polls `args`' JSON report until `check` holds.
async fn report_until(config: &Path, args: &[&str], what: &str, check: impl Fn(&Value) -> bool) -> (Value, i32) {
    let start = Instant::now();
    loop {
        let last = match report(config, args).await {
            Ok((report, code)) if check(&report) => return (report, code),
            Ok((report, code)) => format!("exit {code}: {report:#}"),
            Err(e) => e,
        };
        assert!(start.elapsed() < WAIT, "not true after {WAIT:?}: {what}; last: {last}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The ids `held --json` lists on the agent of `config`.
async fn held(config: &Path) -> Vec<String> {
    let out = cli(config, &["held", "--json"]).await;
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    list["held"]
        .as_array()
        .map_or(Vec::new(), |held| held.iter().map(|h| h["minion"].as_str().unwrap_or_default().to_string()).collect())
}

/// master-a's `salt-key -D` (60 keys, past the guard's default 50): master-b
/// holds it, master-c (its guard turned off) applies it. Every master says
/// so; release asks first.
#[test]
fn held_deletes_are_told_on_every_master_and_release_asks_first() {
    const N: usize = 60;
    let ids: Vec<String> = (0..N).map(|i| format!("web{i:02}")).collect();
    let dir = tempfile::tempdir().unwrap();
    let key = new_public_key();
    let cluster = ProcessCluster::start(dir.path(), 3, |f| {
        // Every master accepted the same keys before its agent's first start.
        for id in &ids {
            master_writes_pending(&f.pki, id, &key);
            move_key(SaltLine::S3006, &f.pki, id, "minions");
        }
        if f.name == "master-c" {
            let config = std::fs::read_to_string(&f.config_path).unwrap();
            write_private(&f.config_path, &format!("{config}\n[guard]\nenabled = false\n"));
        }
    });
    let config = |idx: usize| cluster.files[idx].config_path.clone();
    let (a, b, c) = (config(0), config(1), config(2));
    let kept = |idx: usize| ids.iter().filter(|id| path(&cluster.files[idx].pki, "minions", id).exists()).count();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        cluster.started().await;
        for config in [&a, &b, &c] {
            report_until(config, &["status", "--json"], "every link up", |r| {
                r["peers"].as_array().is_some_and(|peers| peers.iter().all(|p| p["state"] == "up"))
            })
            .await;
        }
        for id in &ids {
            delete_key(&cluster.files[0].pki, id);
        }
        keysync_tests::wait_until(WAIT, "master-c applied the deletes", || kept(2) == 0).await;
        let start = Instant::now();
        let n = loop {
            let (now_kept, now_held) = (kept(1), held(&b).await.len());
            if now_kept > 0 && now_held == now_kept {
                break now_held;
            }
            assert!(start.elapsed() < WAIT, "master-b holds {now_held} and keeps {now_kept}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };

        // The origin: master-b says it holds them (master-c holds none).
        let holds_n = |r: &Value| {
            r["held_by_peers"]
                .as_array()
                .is_some_and(|peers| peers.len() == 1 && peers[0]["peer"] == "master-b" && peers[0]["count"] == n)
        };
        let (report_a, code) =
            report_until(&a, &["status", "--json"], "master-a hears master-b holds them", holds_n).await;
        assert_eq!(code, 3, "{report_a:#}");
        let told = of_kind(&report_a, "held-by-peer");
        assert_eq!(told.len(), 1, "{report_a:#}");
        assert_eq!(told[0]["level"], "error");
        assert_eq!(told[0]["masters"], serde_json::json!(["master-b", "master-a"]));
        let says = format!("master-b says it holds {n} of this master's deletes");
        assert!(told[0]["message"].as_str().unwrap().starts_with(&says), "{told:#?}");
        let out = cli(&a, &["status"]).await;
        let table = text(&out.stdout);
        assert_eq!(out.status.code(), Some(3), "{table}");
        assert!(
            table.contains(&format!(
                "HELD BY PEERS: {says} (see `salt-keysync held` there; `revert` or `release` there)"
            )),
            "{table}"
        );

        // master-b, which holds them, and master-c, which holds nothing.
        let (report_b, _) = report_until(&b, &["status", "--cluster", "--json"], "master-b's held deletes", |r| {
            !of_kind(r, "held-deletes").is_empty()
        })
        .await;
        let here = of_kind(&report_b, "held-deletes");
        assert_eq!(here.len(), 1, "{report_b:#}");
        assert_eq!(here[0]["level"], "error");
        assert!(
            here[0]["message"].as_str().unwrap().starts_with(&format!("master-b holds {n} deletes made on master-a")),
            "{here:#?}"
        );
        let (report_c, code) =
            report_until(&c, &["status", "--cluster", "--json"], "master-c hears master-b holds them", |r| {
                !of_kind(r, "held-by-peer").is_empty()
            })
            .await;
        assert_eq!(code, 3);
        let told = of_kind(&report_c, "held-by-peer");
        assert!(
            told[0]["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("master-b says it holds {n} deletes made on master-a")),
            "{told:#?}"
        );
        let row_b = report_c["masters"].as_array().unwrap().iter().find(|m| m["name"] == "master-b").unwrap().clone();
        assert!(row_b["findings"].as_array().unwrap().iter().any(|f| f["kind"] == "held-by-peer"), "{row_b:#}");
        let out = cli(&c, &["status", "--cluster"]).await;
        assert_eq!(out.status.code(), Some(3));
        assert!(text(&out.stdout).contains(&format!("ERROR    master-b says it holds {n} deletes made on master-a")));

        // release and revert ask first: without a terminal and without -y, nothing.
        for action in ["release", "revert"] {
            let out = cli(&b, &[action]).await;
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{action}: {stderr}");
            assert!(
                stderr.contains("no terminal to ask on") && stderr.contains("-y"),
                "{action} says how to go on: {stderr}"
            );
            assert!(text(&out.stdout).contains(&format!("{n} held deletes from master-a")), "{action}: the plan first");
        }
        let out = cli(&b, &["release", "--dry-run"]).await;
        let plan = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{plan}{}", text(&out.stderr));
        assert!(plan.contains(&format!("{n} held deletes from master-a")), "{plan}");
        let first = held(&b).await.into_iter().min().unwrap();
        assert!(plan.contains(&first) && plan.contains("--dry-run: nothing changed"), "{plan}");
        let out = cli(&b, &["revert", "--dry-run", "--json", "--origin", "master-a"]).await;
        let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!((plan["action"].as_str(), plan["dry_run"].as_bool()), (Some("revert"), Some(true)), "{plan:#}");
        assert_eq!(plan["held"].as_array().map(Vec::len), Some(n), "{plan:#}");
        assert_eq!(held(&b).await.len(), n, "nothing released or reverted");
        assert_eq!(kept(1), n);

        // At a terminal it asks, as salt-key does: a delete is not done by default.
        let out = at_terminal(&b, &["release"], "\n").await;
        let said = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{said}{}", text(&out.stderr));
        assert!(said.contains(&format!("release {n} held deletes:\n")), "the plan: {said}");
        assert!(said.contains("Proceed? [N/y] not confirmed: nothing changed\n"), "{said}");
        let out = at_terminal(&b, &["revert", &first], "no\n").await;
        assert!(text(&out.stdout).contains("Proceed? [n/Y] not confirmed: nothing changed\n"), "{}", text(&out.stdout));
        assert_eq!(held(&b).await.len(), n, "nothing released or reverted");
        let out = at_terminal(&b, &["release", &first], "y\n").await;
        let said = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{said}{}", text(&out.stderr));
        assert!(said.contains("Proceed? [N/y] 1 released: deleted here"), "{said}");
        keysync_tests::wait_until(WAIT, "one released on master-b", || {
            !path(&cluster.files[1].pki, "minions", &first).exists()
        })
        .await;
        assert_eq!(held(&b).await.len(), n - 1);

        let out = cli(&b, &["release", "-y"]).await;
        let said = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{said}{}", text(&out.stderr));
        assert!(said.starts_with(&format!("{} released", n - 1)), "with -y, only the outcome: {said}");
        keysync_tests::wait_until(WAIT, "released on master-b", || kept(1) == 0).await;
        for config in [&a, &b, &c] {
            let (_, code) = report_until(config, &["status", "--cluster", "--json"], "nothing held anywhere", |r| {
                of_kind(r, "held-deletes").is_empty() && of_kind(r, "held-by-peer").is_empty()
            })
            .await;
            assert_eq!(code, 0);
        }
    });
    cluster.stop();
}

/// A push of `decisions` as master-b (retried while its budget is busy).
async fn push(client: &v1::key_sync_client::KeySyncClient<tonic::transport::Channel>, decisions: Vec<v1::Decision>) {
    for _ in 0..100 {
        let stream = tokio_stream::iter([v1::DecisionBatch { decisions: decisions.clone() }]);
        match client.clone().push(stream).await {
            Ok(acks) => {
                acks.into_inner().message().await.unwrap();
                return;
            }
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("push refused: {status}"),
        }
    }
    panic!("push refused a hundred times");
}

/// Decisions a peer sent that were refused are warnings on the master that
/// refused them, per peer, counted over the last hour: those made in the
/// future (the peer's clock ahead) apart from the others (invalid ones
/// here). Warnings only: `status` exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_decisions_are_findings_per_peer() {
    let mut cluster = TestCluster::start(2).await;
    // Only this client speaks as master-b from now on.
    cluster.stop(1).await;
    let config = cluster.agents[0].files.config_path.clone();
    let client = peer_client(cluster.agents[0].addr, "master-a", &identity(&cluster, "master-b")).await;
    client.clone().hello(hello_as("master-b")).await.unwrap();
    let key = new_public_key();
    let ahead = now_hlc(Duration::from_secs(3600));
    push(
        &client,
        vec![
            wire_accept("future01", &key, ahead),
            wire_accept("future02", &key, ahead),
            wire_accept("bad/id", &key, now_hlc(Duration::ZERO)),
        ],
    )
    .await;
    let (report, code) = report_until(&config, &["status", "--cluster", "--json"], "refusals are findings", |r| {
        !of_kind(r, "clock-refused").is_empty() && !of_kind(r, "refused").is_empty()
    })
    .await;
    assert_eq!(code, 0, "warnings only: {report:#}");
    let clock = &of_kind(&report, "clock-refused")[0];
    assert_eq!((clock["level"].as_str(), clock["masters"].clone()), (Some("warning"), serde_json::json!(["master-b"])));
    let message = clock["message"].as_str().unwrap();
    assert!(
        message
            .starts_with("master-b sent 2 decisions made in the future in the last hour (2 since this agent started)"),
        "{message}"
    );
    let other = &of_kind(&report, "refused")[0];
    let message = other["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "master-b sent 1 decision refused for another cause in the last hour (1 since this agent started)"
        ),
        "{message}"
    );
    let out = cli(&config, &["status"]).await;
    assert_eq!(out.status.code(), Some(0));
    let table = text(&out.stdout);
    assert!(table.contains("WARNING: master-b sent 2 decisions made in the future"), "{table}");
    cluster.shutdown().await;
}
