//! The alert rules and the dashboard shipped in packaging/monitoring/: every
//! metric they use is one a running agent really exports (read from two
//! agents' /metrics, not from a list), the alerts follow the mixin
//! conventions, each has a runbook section in docs/monitoring.md and a
//! firing case in alerts.test.yml (which `scripts/check-monitoring.sh` runs
//! with promtool).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use keysync_tests::binary::{free_addr, ProcessCluster};
use keysync_tests::probe::{metrics_text, write_private};
use keysync_tests::wait_until;
use yaml_rust2::{Yaml, YamlLoader};

const RUNBOOK: &str = "https://github.com/salt-keysync/salt-keysync/blob/main/docs/monitoring.md#";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn alert_rules() -> Vec<Yaml> {
    let docs = YamlLoader::load_from_str(&read("packaging/monitoring/alerts.yml")).expect("alerts.yml is YAML");
    docs[0]["groups"]
        .as_vec()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_vec().expect("rules").clone())
        .collect()
}

/// Every PromQL expression of the rules and the dashboard (its queries and
/// its variables' queries), each with where it comes from.
fn expressions() -> Vec<(String, String)> {
    let mut exprs: Vec<(String, String)> = alert_rules()
        .iter()
        .map(|rule| (format!("alert {}", rule["alert"].as_str().unwrap()), rule["expr"].as_str().unwrap().to_string()))
        .collect();
    let dashboard: serde_json::Value = serde_json::from_str(&read("packaging/monitoring/dashboard.json")).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap();
            exprs.push((format!("panel {title:?}"), target["expr"].as_str().unwrap().to_string()));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            exprs.push((format!("variable {}", variable["name"]), query.to_string()));
        }
    }
    exprs
}

/// Metric names in a PromQL expression: identifiers starting `keysync_`, and
/// any other name right before a `{` selector.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let bytes = expr.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < bytes.len() {
        if is_ident(bytes[i]) && (i == 0 || !is_ident(bytes[i - 1])) {
            let start = i;
            while i < bytes.len() && is_ident(bytes[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            let in_braces = expr[..start].matches('{').count() > expr[..start].matches('}').count();
            let selector = expr[i..].trim_start().starts_with('{');
            if !in_braces
                && !word.starts_with(|c: char| c.is_ascii_digit())
                && (word.starts_with("keysync_") || selector)
            {
                names.insert(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The sample names in an OpenMetrics text (`name{labels} value`).
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| line.split(['{', ' ']).next().unwrap().to_string())
        .collect()
}

#[test]
fn the_rules_and_the_dashboard_use_only_metrics_an_agent_exports() {
    let dir = tempfile::tempdir().unwrap();
    let addrs = Mutex::new(Vec::new());
    let cluster = ProcessCluster::start(dir.path(), 2, |f| {
        let addr = free_addr();
        addrs.lock().unwrap().push(addr);
        let text = std::fs::read_to_string(&f.config_path).unwrap();
        write_private(&f.config_path, &format!("metrics_listen = \"{addr}\"\n{text}"));
    });
    let addrs = addrs.into_inner().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let exported = rt.block_on(async {
        cluster.started().await;
        // Labelled families appear once the peers have met and run a round.
        wait_until(Duration::from_secs(30), "both agents export their peer's health and a round", || {
            addrs.iter().all(|&addr| {
                let text = metrics_text(addr);
                text.contains("keysync_settings_drift{")
                    && text.contains("keysync_peer_last_contact_timestamp_seconds{")
                    && text.contains("keysync_anti_entropy_runs_total{")
            })
        })
        .await;
        addrs.iter().flat_map(|&addr| sample_names(&metrics_text(addr))).collect::<BTreeSet<String>>()
    });
    cluster.stop();

    let mut used = BTreeSet::new();
    for (source, expr) in expressions() {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "{source}: no metric found in {expr:?}");
        for name in names {
            if name == "up" {
                continue; // Prometheus's own, one per scrape target.
            }
            // A histogram is used by its series, a counter by its _total.
            assert!(exported.contains(&name), "{source} uses {name}, which no agent exports; exported:\n{exported:#?}");
            used.insert(name);
        }
    }
    assert!(used.len() >= 14, "suspiciously few metrics found in the rules and the dashboard: {used:?}");
}

#[test]
fn metric_names_are_found_in_promql() {
    assert_eq!(
        metric_names(r#"histogram_quantile(0.99, sum by (job, le) (rate(keysync_a_bucket{job=~"$job"}[5m]))) > 1"#),
        BTreeSet::from(["keysync_a_bucket".to_string()])
    );
    assert_eq!(
        metric_names(r#"(time() - keysync_b > 600) and keysync_c == 1 or up{job="x"} == 0"#),
        BTreeSet::from(["keysync_b".to_string(), "keysync_c".to_string(), "up".to_string()])
    );
    assert_eq!(metric_names(r#"label_values(keysync_build_info{job=~"$job"}, instance)"#).len(), 1);
}

#[test]
fn alerts_follow_the_conventions_with_a_runbook_and_a_test_each() {
    let runbook = read("docs/monitoring.md");
    let tests = YamlLoader::load_from_str(&read("packaging/monitoring/alerts.test.yml")).unwrap().remove(0);
    let fired: BTreeSet<&str> = tests["tests"]
        .as_vec()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_vec().unwrap())
        .filter(|case| case["exp_alerts"].as_vec().is_some_and(|alerts| !alerts.is_empty()))
        .map(|case| case["alertname"].as_str().unwrap())
        .collect();
    let rules = alert_rules();
    assert!(rules.len() >= 9, "{} alerts", rules.len());
    for rule in &rules {
        let name = rule["alert"].as_str().expect("every rule is an alert");
        assert!(
            name.starts_with("SaltKeysync") && name.chars().all(|c| c.is_ascii_alphanumeric()),
            "{name}: alert names are CamelCase with the SaltKeysync prefix"
        );
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(["critical", "warning", "info"].contains(&severity), "{name}: severity {severity:?}");
        let annotations = &rule["annotations"];
        let summary = annotations["summary"].as_str().unwrap_or_default();
        assert!(!summary.is_empty() && !summary.contains("{{"), "{name}: the summary is static: {summary:?}");
        let description = annotations["description"].as_str().unwrap_or_default();
        assert!(description.contains("{{ $labels."), "{name}: the description names what fired: {description:?}");
        let url = annotations["runbook_url"].as_str().unwrap_or_default();
        assert_eq!(url, format!("{RUNBOOK}{}", name.to_lowercase()), "{name}: runbook_url");
        assert!(
            runbook.contains(&format!("\n### {name}\n")),
            "{name}: no \"### {name}\" section in docs/monitoring.md"
        );
        assert!(runbook.contains(&format!("[{name}](#{})", name.to_lowercase())), "{name}: not in the alerts table");
        assert!(fired.contains(name), "{name}: no case in alerts.test.yml where it fires");
    }
}

#[test]
fn the_dashboard_is_a_grafana_dashboard_on_a_data_source_variable() {
    let dashboard: serde_json::Value = serde_json::from_str(&read("packaging/monitoring/dashboard.json")).unwrap();
    assert_eq!(dashboard["uid"], "salt-keysync");
    let variables: Vec<&str> =
        dashboard["templating"]["list"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(variables, ["datasource", "job", "instance"]);
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "{title}: duplicate panel id");
        let pos = &panel["gridPos"];
        assert!(pos["x"].as_u64().unwrap() + pos["w"].as_u64().unwrap() <= 24, "{title}: wider than the grid");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        assert!(!panel["description"].as_str().unwrap_or_default().is_empty(), "{title}: no description");
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            assert!(expr.contains(r#"job=~"$job""#), "{title}: {expr} ignores the job variable");
        }
    }
}
