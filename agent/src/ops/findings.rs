//! What is wrong with the masters as this agent sees them, worst first.
//!
//! A master that accepts keys by itself is an error on EVERY master, not
//! only its own: each key it accepts is accepted everywhere by replication.
//! So each agent judges every master it knows (its own and its peers', from
//! their `Hello`), exports it as `keysync_master_auto_accept`, and logs and
//! audits each change once. Salt versions are compared the same way, and
//! so are the agents' own versions: agents of different releases side by
//! side are a rolling upgrade that has not ended (a warning until it has).

use std::collections::{BTreeMap, BTreeSet};

use keysync_machine::PeerName;
use serde::{Deserialize, Serialize};

use crate::disk::accept::AUTO_ACCEPT_SETTINGS;
use crate::disk::audit::{Action, AuditLog, Outcome, Record, Via};
use crate::disk::health::MasterHealth;
use crate::ops::metrics::{AutoAcceptLabel, Metrics, SaltLabel};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Error,
    Warning,
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Level::Error => "error",
            Level::Warning => "warning",
        })
    }
}

/// One thing wrong, for `status` and scripts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub level: Level,
    /// `auto-accept`, `master-key`, `settings`, `salt-version`, `agent-version`,
    /// `held-deletes`, `held-by-peer`, `clock-refused`, `refused`,
    /// `writes-failing` or `stale`.
    pub kind: String,
    /// The masters it is about.
    pub masters: Vec<String>,
    pub message: String,
}

/// Every master this agent knows: its own first, then the peers (health
/// `None` while a peer has not reported).
pub type Masters<'a> = Vec<(&'a str, Option<&'a MasterHealth>)>;

/// How `master` accepts keys by itself, if it does and is known.
fn auto_accepting(health: Option<&MasterHealth>) -> Option<Vec<(&'static str, String)>> {
    health.and_then(|h| h.accept.as_ref()).map(|accept| accept.auto_accepting())
}

/// The known Salt versions and the masters running each, when they differ.
pub fn version_skew(masters: &Masters<'_>) -> Option<BTreeMap<String, Vec<String>>> {
    let mut by_version: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, health) in masters {
        if let Some(version) = health.and_then(|h| h.salt_version.as_ref()) {
            by_version.entry(version.clone()).or_default().push(name.to_string());
        }
    }
    (by_version.len() > 1).then_some(by_version)
}

/// The version of salt-keysync an agent that reported without one runs:
/// agents of 0.1.0 did not send their version (every build before 0.2.0
/// called itself 0.1.0).
pub const UNSENT_AGENT_VERSION: &str = "0.1.0";

/// The salt-keysync version of a master's agent, as far as its report
/// tells; `None` while it has not reported.
pub fn agent_version(health: Option<&MasterHealth>) -> Option<String> {
    health.map(|h| h.agent_version.clone().unwrap_or_else(|| UNSENT_AGENT_VERSION.into()))
}

/// The salt-keysync versions the masters' agents run, and the masters
/// running each, when they differ (a rolling upgrade not ended).
pub fn mixed_versions(masters: &Masters<'_>) -> Option<BTreeMap<String, Vec<String>>> {
    let mut by_version: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, health) in masters {
        if let Some(version) = agent_version(*health) {
            by_version.entry(version).or_default().push(name.to_string());
        }
    }
    (by_version.len() > 1).then_some(by_version)
}

fn describe_mixed(mixed: &BTreeMap<String, Vec<String>>) -> String {
    let parts: Vec<String> =
        mixed.iter().map(|(version, masters)| format!("{version} on {}", masters.join(", "))).collect();
    format!(
        "the agents run different salt-keysync versions: {}; finish the upgrade (\"Upgrading the agent\" in /usr/share/doc/salt-keysync/operations.md)",
        parts.join("; ")
    )
}

fn describe_skew(skew: &BTreeMap<String, Vec<String>>) -> String {
    let parts: Vec<String> =
        skew.iter().map(|(version, masters)| format!("{version} on {}", masters.join(", "))).collect();
    format!("the masters run different Salt versions: {}", parts.join("; "))
}

fn auto_accept_message(master: &str, how: &[(&'static str, String)]) -> String {
    let how: Vec<&str> = how.iter().map(|(_, text)| text.as_str()).collect();
    format!(
        "{master} accepts keys by itself ({}): every key it accepts is accepted on every master by replication",
        how.join(", ")
    )
}

/// Everything wrong, errors first: auto-accepting masters, `master.pub`
/// mismatches and drift with each peer (`drift`: peer name → what differs),
/// Salt version skew, agents of different versions.
pub fn findings(masters: &Masters<'_>, drift: &[(&str, &crate::disk::health::Drift)]) -> Vec<Finding> {
    let mut found = Vec::new();
    for (name, health) in masters {
        if let Some(how) = auto_accepting(*health).filter(|how| !how.is_empty()) {
            found.push(Finding {
                level: Level::Error,
                kind: "auto-accept".into(),
                masters: vec![name.to_string()],
                message: auto_accept_message(name, &how),
            });
        }
    }
    for (peer, drift) in drift {
        if drift.master_pub_mismatch {
            found.push(Finding {
                level: Level::Error,
                kind: "master-key".into(),
                masters: vec![peer.to_string()],
                message: format!(
                    "{peer}'s master.pub differs from this master's: every master must share one master.pem/master.pub"
                ),
            });
        }
        if !drift.settings.is_empty() {
            found.push(Finding {
                level: Level::Warning,
                kind: "settings".into(),
                masters: vec![peer.to_string()],
                message: format!("settings of {peer} differ from this master's: {}", drift.settings.join(", ")),
            });
        }
    }
    if let Some(skew) = version_skew(masters) {
        found.push(Finding {
            level: Level::Warning,
            kind: "salt-version".into(),
            masters: skew.values().flatten().cloned().collect(),
            message: describe_skew(&skew),
        });
    }
    if let Some(mixed) = mixed_versions(masters) {
        found.push(Finding {
            level: Level::Warning,
            kind: "agent-version".into(),
            masters: mixed.values().flatten().cloned().collect(),
            message: describe_mixed(&mixed),
        });
    }
    found.sort_by_key(|f| f.level);
    found
}

/// What was reported about every master, so each change is reported once.
#[derive(Default)]
pub struct Reported {
    /// Master → the settings it auto-accepts through, as last audited.
    auto_accept: BTreeMap<String, BTreeSet<&'static str>>,
    /// Master → the version label exported for it.
    salt_version: BTreeMap<String, String>,
    skew: Option<BTreeMap<String, Vec<String>>>,
    mixed: Option<BTreeMap<String, Vec<String>>>,
}

impl Reported {
    /// Judges every master again (after any report changed): metrics set,
    /// and each new or ended auto-acceptance logged and audited, each new
    /// Salt version skew and each new mix of agent versions logged. A
    /// master not known yet changes nothing.
    pub fn evaluate(&mut self, this_node: &str, masters: &Masters<'_>, audit: &AuditLog, metrics: &Metrics) {
        for (name, health) in masters {
            let Some(how) = auto_accepting(*health) else { continue };
            for setting in AUTO_ACCEPT_SETTINGS {
                let on = how.iter().any(|(s, _)| *s == setting);
                let label = AutoAcceptLabel { master: name.to_string(), setting };
                metrics.master_auto_accept.get_or_create(&label).set(i64::from(on));
            }
            let settings: BTreeSet<&'static str> = how.iter().map(|(s, _)| *s).collect();
            let before = self.auto_accept.insert(name.to_string(), settings.clone()).unwrap_or_default();
            if settings == before {
                continue;
            }
            // A peer's name as the board keeps it (`Masters` holds this node's too).
            let peer = PeerName::trusted(*name);
            let via = if *name == this_node { Via::Local } else { Via::Peer(&peer) };
            let record = |outcome: Outcome, reason: String| Record {
                origin: Some(name.to_string()),
                peer: (*name != this_node).then(|| name.to_string()),
                reason: Some(reason),
                ..Record::new(Action::AutoAccept, via, outcome)
            };
            if !settings.is_empty() {
                let message = auto_accept_message(name, &how);
                tracing::error!(master = %name, "{message}; turn it off unless that is intended");
                audit.record(record(Outcome::Detected, message));
            } else {
                tracing::info!(master = %name, "the master no longer accepts keys by itself");
                audit.record(record(Outcome::Resolved, format!("{name} no longer accepts keys by itself")));
            }
        }
        for (name, health) in masters {
            let Some(health) = health else { continue };
            let version = health.salt_version.clone().unwrap_or_default();
            if let Some(old) = self.salt_version.insert(name.to_string(), version.clone()) {
                if old == version {
                    continue;
                }
                metrics.master_salt_info.remove(&SaltLabel { master: name.to_string(), salt_version: old });
            }
            metrics
                .master_salt_info
                .get_or_create(&SaltLabel { master: name.to_string(), salt_version: version })
                .set(1);
        }
        let skew = version_skew(masters);
        if skew != self.skew {
            match &skew {
                Some(skew) => tracing::warn!("{}", describe_skew(skew)),
                None => tracing::info!("the masters' Salt versions agree again"),
            }
            self.skew = skew;
        }
        let mixed = mixed_versions(masters);
        if mixed != self.mixed {
            match &mixed {
                Some(mixed) => tracing::warn!("{}", describe_mixed(mixed)),
                None => tracing::info!("every agent runs the same salt-keysync version again"),
            }
            self.mixed = mixed;
        }
    }

    /// Drops a peer removed by a reload, and its series.
    pub fn forget(&mut self, master: &str, metrics: &Metrics) {
        self.auto_accept.remove(master);
        for setting in AUTO_ACCEPT_SETTINGS {
            metrics.master_auto_accept.remove(&AutoAcceptLabel { master: master.to_string(), setting });
        }
        if let Some(version) = self.salt_version.remove(master) {
            metrics.master_salt_info.remove(&SaltLabel { master: master.to_string(), salt_version: version });
        }
    }
}

/// `n decisions`, `1 decision`.
fn decisions(n: u64) -> String {
    if n == 1 {
        "1 decision".into()
    } else {
        format!("{n} decisions")
    }
}

/// Issue 28 item 2: what the blast-radius guard holds, here and as the
/// peers say theirs do, the decisions peers sent that were refused here in
/// the last hour, and this master's failing writes or staleness, added to
/// the findings of `report` (errors first again), with `held_by_peers` set.
/// Called once the report is whole (the control socket's `status`).
///
/// Held deletes are errors wherever they are seen: the origin no longer
/// serves those minions, the masters holding them still do, until an
/// operator there decides. Refusals are warnings.
pub fn add_guard_findings(report: &mut crate::ops::board::StatusReport) {
    use crate::ops::refused::Cause;
    let this = report.node.clone();
    let mut found = Vec::new();
    for burst in &report.held {
        let more = if burst.count > burst.first.len() { ", …" } else { "" };
        found.push(Finding {
            level: Level::Error,
            kind: "held-deletes".into(),
            masters: vec![this.clone(), burst.origin.clone()],
            message: format!(
                "{this} holds {} deletes made on {} since {} ({}{more}): a mass delete its guard keeps from \
                 {this}'s keys; `salt-keysync held` on {this} lists them, `revert` there restores them on {}, \
                 `release` there applies them",
                burst.count,
                burst.origin,
                burst.since,
                burst.first.join(", "),
                burst.origin
            ),
        });
    }
    let mut by_peers = Vec::new();
    for peer in &report.peers {
        for held in &peer.holds {
            let name = &peer.name;
            let whose = if held.origin == this {
                by_peers.push(crate::ops::held::HeldByPeer { peer: name.clone(), count: held.count });
                format!("{} of this master's deletes: a mass delete made here", held.count)
            } else {
                format!("{} deletes made on {}: a mass delete", held.count, held.origin)
            };
            found.push(Finding {
                level: Level::Error,
                kind: "held-by-peer".into(),
                masters: vec![name.clone(), held.origin.clone()],
                message: format!(
                    "{name} says it holds {whose} its guard keeps from its keys (its own count, as of its last \
                     Hello); `salt-keysync held` on {name} lists them, `revert` or `release` there ends it"
                ),
            });
        }
    }
    for refused in report.refused.iter().filter(|r| r.last_hour > 0) {
        let (peer, n, total) = (&refused.peer, refused.last_hour, refused.since_start);
        let (kind, message) = match refused.cause {
            Cause::Clock => (
                "clock-refused",
                format!(
                    "{peer} sent {} made in the future in the last hour ({total} since this agent started): \
                     further ahead of this master's clock than max_clock_skew, refused; the clock of {peer} or of \
                     the master that made them runs ahead (`salt-keysync audit --action refuse --since 1h` \
                     lists them)",
                    decisions(n)
                ),
            ),
            Cause::Other => (
                "refused",
                format!(
                    "{peer} sent {} refused for another cause in the last hour ({total} since this agent \
                     started): invalid, naming an origin that is no master of this site, or claiming this master \
                     as its origin (`salt-keysync audit --action refuse --since 1h` lists them)",
                    decisions(n)
                ),
            ),
        };
        found.push(Finding { level: Level::Warning, kind: kind.into(), masters: vec![peer.clone()], message });
    }
    if let Some(trouble) = &report.write_trouble {
        let finding = Finding {
            level: Level::Error,
            kind: "writes-failing".into(),
            masters: vec![this.clone()],
            message: trouble.clone(),
        };
        found.push(finding);
    }
    if let Some(stale) = &report.stale {
        let finding =
            Finding { level: Level::Error, kind: "stale".into(), masters: vec![this.clone()], message: stale.clone() };
        found.push(finding);
    }
    report.held_by_peers = by_peers;
    report.findings.extend(found);
    report.findings.sort_by_key(|f| f.level);
}

/// Whether any of `findings` is an error: `status` then exits with
/// [`crate::cli::status::EXIT_ERROR_FINDING`].
pub fn any_error(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.level == Level::Error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::accept::AcceptSettings;
    use crate::disk::audit::read_all;

    fn health(version: &str, auto_accept: bool) -> MasterHealth {
        MasterHealth {
            salt_version: Some(version.into()),
            accept: Some(AcceptSettings { auto_accept, ..AcceptSettings::salt_defaults() }),
            ..MasterHealth::default()
        }
    }

    #[test]
    fn an_auto_accepting_peer_is_an_error_reported_once_and_when_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let audit = AuditLog::open(&dir.path().join("audit.jsonl"), "master-a").unwrap();
        let metrics = Metrics::new("master-a");
        let mut reported = Reported::default();
        let (a, b_on, b_off) = (health("3008.3", false), health("3008.3", true), health("3008.3", false));

        for _ in 0..3 {
            reported.evaluate(
                "master-a",
                &vec![("master-a", Some(&a)), ("master-b", Some(&b_on)), ("master-c", None)],
                &audit,
                &metrics,
            );
        }
        let text = metrics.encode();
        assert!(text.contains(r#"keysync_master_auto_accept{master="master-b",setting="auto_accept"} 1"#), "{text}");
        assert!(text.contains(r#"keysync_master_auto_accept{master="master-a",setting="auto_accept"} 0"#), "{text}");
        assert!(!text.contains(r#"master="master-c""#), "an unknown master has no series: {text}");
        let masters = vec![("master-a", Some(&a)), ("master-b", Some(&b_on))];
        let found = findings(&masters, &[]);
        assert_eq!((found[0].level, found[0].kind.as_str()), (Level::Error, "auto-accept"));
        assert!(found[0].message.starts_with("master-b accepts keys by itself (auto_accept: True)"), "{found:?}");

        // Unknown again (reconnecting) resolves nothing; fixed does.
        reported.evaluate("master-a", &vec![("master-a", Some(&a)), ("master-b", None)], &audit, &metrics);
        reported.evaluate("master-a", &vec![("master-a", Some(&a)), ("master-b", Some(&b_off))], &audit, &metrics);
        let records: Vec<(String, String, Option<String>)> =
            read_all(audit.path()).unwrap().into_iter().map(|r| (r.action, r.outcome, r.origin)).collect();
        let b = Some("master-b".to_string());
        assert_eq!(
            records,
            [("auto-accept".into(), "detected".into(), b.clone()), ("auto-accept".into(), "resolved".into(), b)]
        );
        assert!(findings(&vec![("master-a", Some(&a)), ("master-b", Some(&b_off))], &[]).is_empty());
    }

    #[test]
    fn versions_are_exported_per_master_and_skew_is_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let audit = AuditLog::open(&dir.path().join("audit.jsonl"), "master-a").unwrap();
        let metrics = Metrics::new("master-a");
        let mut reported = Reported::default();
        let (a, b_old, b_new) = (health("3008.3", false), health("3006.28", false), health("3008.3", false));
        let skewed = vec![("master-a", Some(&a)), ("master-b", Some(&b_old))];
        reported.evaluate("master-a", &skewed, &audit, &metrics);
        let found = findings(&skewed, &[]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].level, Level::Warning);
        assert_eq!(
            found[0].message,
            "the masters run different Salt versions: 3006.28 on master-b; 3008.3 on master-a"
        );
        let upgraded = vec![("master-a", Some(&a)), ("master-b", Some(&b_new))];
        reported.evaluate("master-a", &upgraded, &audit, &metrics);
        let text = metrics.encode();
        assert!(text.contains(r#"keysync_master_salt_info{master="master-b",salt_version="3008.3"} 1"#), "{text}");
        assert!(!text.contains("3006.28"), "the old version's series is gone: {text}");
        assert!(findings(&upgraded, &[]).is_empty());
        reported.forget("master-b", &metrics);
        assert!(!metrics.encode().contains(r#"master="master-b""#));
    }

    /// Issue 28 item 2: deletes held here and as peers say, refusals of the
    /// last hour, failing writes; errors first, warnings after.
    #[test]
    fn held_deletes_refusals_and_failing_writes_are_findings() {
        let mut report: crate::ops::board::StatusReport = serde_json::from_value(serde_json::json!({
            "node": "master-a", "version": "0.2.0", "now": "2026-11-27T10:00:00Z",
            "started": "2026-11-27T09:00:00Z",
            "keys": {"accepted": 1, "rejected": 0, "pending": 0, "deleted": 0},
            "health": {"master_pub": null, "settings": {}},
            "peers": [{
                "name": "master-b", "address": "b:4515", "state": "up", "last_error": null,
                "last_contact": null, "anti_entropy": null, "health": null,
                "drift": {"master_pub_mismatch": false, "settings": []},
                "holds": [{"origin": "master-a", "count": 20}, {"origin": "master-c", "count": 5}]
            }],
            "findings": [{"level": "warning", "kind": "salt-version", "masters": [], "message": "skew"}],
            "held": [{"origin": "master-c", "count": 7, "since": "2026-11-27T09:59:00Z", "first": ["web01"]}],
            "refused": [
                {"peer": "master-b", "cause": "clock", "last_hour": 1, "since_start": 4},
                {"peer": "master-b", "cause": "other", "last_hour": 0, "since_start": 2}
            ],
            "write_trouble": "writes failing for 5s: state store: No space left on device"
        }))
        .unwrap();
        add_guard_findings(&mut report);
        let found: Vec<(Level, &str, Vec<&str>, &str)> = report
            .findings
            .iter()
            .map(|f| (f.level, f.kind.as_str(), f.masters.iter().map(String::as_str).collect(), f.message.as_str()))
            .collect();
        let kinds: Vec<(Level, &str)> = found.iter().map(|f| (f.0, f.1)).collect();
        assert_eq!(
            kinds,
            [
                (Level::Error, "held-deletes"),
                (Level::Error, "held-by-peer"),
                (Level::Error, "held-by-peer"),
                (Level::Error, "writes-failing"),
                (Level::Warning, "salt-version"),
                (Level::Warning, "clock-refused"),
            ],
            "errors first; no finding for refusals older than an hour: {found:#?}"
        );
        assert_eq!(found[0].2, ["master-a", "master-c"]);
        assert!(found[0]
            .3
            .starts_with("master-a holds 7 deletes made on master-c since 2026-11-27T09:59:00Z (web01, …)"));
        assert_eq!(
            (found[1].2.clone(), found[2].2.clone()),
            (vec!["master-b", "master-a"], vec!["master-b", "master-c"])
        );
        assert!(found[1].3.starts_with("master-b says it holds 20 of this master's deletes: a mass delete made here"));
        assert!(found[2].3.starts_with("master-b says it holds 5 deletes made on master-c: a mass delete"));
        assert!(found[2].3.contains("`salt-keysync held` on master-b lists them, `revert` or `release` there"));
        assert!(found[5].3.starts_with("master-b sent 1 decision made in the future in the last hour (4 since"));
        assert_eq!(report.held_by_peers, [crate::ops::held::HeldByPeer { peer: "master-b".into(), count: 20 }]);
        assert!(any_error(&report.findings));
        assert!(!any_error(&report.findings[4..]));
    }

    #[test]
    fn agents_of_different_versions_are_a_warning_until_the_upgrade_ends() {
        let agent = |version: Option<&str>| MasterHealth {
            agent_version: version.map(str::to_string),
            ..health("3008.3", false)
        };
        let (a, b_old, c_new) = (agent(Some("0.2.0")), agent(None), agent(Some("0.2.0")));
        // master-b reported without a version: an agent of 0.1.0.
        let upgrading = vec![("master-a", Some(&a)), ("master-b", Some(&b_old)), ("master-c", Some(&c_new))];
        let found = findings(&upgrading, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].level, found[0].kind.as_str()), (Level::Warning, "agent-version"));
        assert_eq!(found[0].masters, ["master-b", "master-a", "master-c"]);
        assert!(
            found[0].message.starts_with(
                "the agents run different salt-keysync versions: 0.1.0 on master-b; 0.2.0 on master-a, master-c; \
                 finish the upgrade"
            ),
            "{found:?}"
        );
        let newer = agent(Some("0.3.0"));
        let found = findings(&vec![("master-a", Some(&a)), ("master-b", Some(&newer))], &[]);
        assert_eq!(found[0].masters, ["master-a", "master-b"], "a newer peer is a mix too: {found:?}");
        // A master that has not reported is unknown, not another version.
        let b_new = agent(Some("0.2.0"));
        assert!(findings(&vec![("master-a", Some(&a)), ("master-b", Some(&b_new)), ("master-c", None)], &[]).is_empty());
        assert_eq!(agent_version(None), None);
        assert_eq!(agent_version(Some(&b_old)).as_deref(), Some("0.1.0"));
    }
}
