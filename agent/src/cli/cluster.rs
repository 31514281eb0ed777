//! `salt-keysync status --cluster`: every master as this agent knows it, in
//! one table (link, last contact, key counts, Salt version, agent version,
//! findings), then every finding in full; `--json` for scripts. Made from the same report as
//! `status`, so it asks the agent nothing more.

use serde::{Deserialize, Serialize};

use crate::disk::health::KeyCounts;
use crate::ops::board::{LinkState, StatusReport};
use crate::ops::findings::{agent_version, Finding, Level};

/// One master, as `status --cluster --json` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterRow {
    pub name: String,
    /// The master of the agent asked.
    pub this: bool,
    /// The link to it; `None` for this master.
    pub link: Option<LinkState>,
    /// Last message from its agent (RFC 3339); `None` for this master or never.
    pub last_contact: Option<String>,
    /// As it last reported them; `None` while unknown (or an older agent).
    pub keys: Option<KeyCounts>,
    pub salt_version: Option<String>,
    /// The salt-keysync version of its agent; `None` while unknown ("0.1.0"
    /// for an agent that reported without one: see
    /// [`crate::ops::findings::UNSENT_AGENT_VERSION`]).
    #[serde(default)]
    pub agent_version: Option<String>,
    /// Findings about this master (the full list is in [`ClusterReport::findings`]).
    pub findings: Vec<Finding>,
}

/// What `status --cluster --json` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterReport {
    /// The agent asked.
    pub node: String,
    /// Its salt-keysync version and the replication protocol it speaks.
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub protocol_version: Option<u32>,
    pub now: String,
    pub masters: Vec<MasterRow>,
    /// Everything wrong, errors first.
    pub findings: Vec<Finding>,
}

/// Every master of `report`: this one first, then its peers.
pub fn cluster(report: &StatusReport) -> ClusterReport {
    let about = |name: &str| -> Vec<Finding> {
        report.findings.iter().filter(|f| f.masters.iter().any(|m| m == name)).cloned().collect()
    };
    let mut masters = vec![MasterRow {
        name: report.node.clone(),
        this: true,
        link: None,
        last_contact: None,
        keys: Some(report.keys.clone()),
        salt_version: report.health.salt_version.clone(),
        agent_version: Some(report.version.clone()),
        findings: about(&report.node),
    }];
    for peer in &report.peers {
        let health = peer.health.as_ref();
        masters.push(MasterRow {
            name: peer.name.clone(),
            this: false,
            link: Some(peer.state),
            last_contact: peer.last_contact.clone(),
            keys: health.and_then(|h| h.keys.clone()),
            salt_version: health.and_then(|h| h.salt_version.clone()),
            agent_version: agent_version(health),
            findings: about(&peer.name),
        });
    }
    ClusterReport {
        node: report.node.clone(),
        version: report.version.clone(),
        protocol_version: report.protocol_version,
        now: report.now.clone(),
        masters,
        findings: report.findings.clone(),
    }
}

/// The table, then the findings in full.
pub fn render(cluster: &ClusterReport) -> String {
    let cluster = &super::status::shown(cluster);
    let now = super::status::parse_time(&cluster.now);
    let mut table = super::table::Table::new([
        "MASTER",
        "LINK",
        "LAST CONTACT",
        "ACCEPTED",
        "REJECTED",
        "PENDING",
        "DELETED",
        "SALT",
        "AGENT",
        "FINDINGS",
    ]);
    for master in &cluster.masters {
        let count = |pick: fn(&KeyCounts) -> usize| master.keys.as_ref().map_or("?".into(), |k| pick(k).to_string());
        table.row([
            if master.this { format!("{} (this)", master.name) } else { master.name.clone() },
            master.link.map_or("-".into(), |l| l.to_string()),
            if master.this { "-".into() } else { super::status::ago(now, &master.last_contact) },
            count(|k| k.accepted),
            count(|k| k.rejected),
            count(|k| k.pending),
            count(|k| k.deleted),
            master.salt_version.clone().unwrap_or_else(|| "?".into()),
            master.agent_version.clone().unwrap_or_else(|| "?".into()),
            summary(&master.findings),
        ]);
    }
    let mut out = table.render();
    out.push_str("\n(key counts: as each master last reported them; ? while unknown)\n");
    let protocol = cluster.protocol_version.map_or(String::new(), |p| format!(", protocol {p}"));
    out.push_str(&format!("asked: {}, salt-keysync {}{protocol}\n", cluster.node, cluster.version));
    if cluster.findings.is_empty() {
        out.push_str(
            "no findings: every master known shares master.pub and settings, none accepts keys by itself, \
             their agents run one version, no guard holds deletes, no decision was refused in the last hour\n",
        );
    }
    for finding in &cluster.findings {
        out.push_str(&format!("{:<8} {}\n", finding.level.to_string().to_uppercase(), finding.message));
    }
    out
}

/// The FINDINGS cell: `ERROR auto-accept`, `WARNING settings`, ….
fn summary(findings: &[Finding]) -> String {
    if findings.is_empty() {
        return "-".into();
    }
    let words: Vec<String> = findings
        .iter()
        .map(|f| match f.level {
            Level::Error => format!("ERROR {}", f.kind),
            Level::Warning => format!("warning {}", f.kind),
        })
        .collect();
    words.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::accept::AcceptSettings;
    use crate::disk::health::{Drift, MasterHealth};
    use crate::ops::board::PeerStatus;

    fn health(version: &str, auto_accept: bool, accepted: usize) -> MasterHealth {
        MasterHealth {
            salt_version: Some(version.into()),
            accept: Some(AcceptSettings { auto_accept, ..AcceptSettings::salt_defaults() }),
            keys: Some(KeyCounts { accepted, rejected: 1, pending: 0, deleted: 2 }),
            ..MasterHealth::default()
        }
    }

    #[test]
    fn one_row_per_master_with_its_findings() {
        let peer = |name: &str, state, health: Option<MasterHealth>| PeerStatus {
            name: name.into(),
            address: "10.0.0.2:4515".into(),
            state,
            last_error: None,
            last_contact: health.as_ref().map(|_| "2026-11-21T12:00:00Z".into()),
            anti_entropy: None,
            health,
            drift: Drift::default(),
            holds: Vec::new(),
            clock: None,
        };
        let local = MasterHealth { agent_version: Some("0.2.0".into()), ..health("3008.3", false, 120) };
        // master-b's agent reported without its version: 0.1.0.
        let b = health("3006.28", true, 120);
        let masters = vec![("master-a", Some(&local)), ("master-b", Some(&b)), ("master-c", None)];
        let report = StatusReport {
            node: "master-a".into(),
            version: "0.2.0".into(),
            protocol_version: Some(2),
            now: "2026-11-21T12:00:03Z".into(),
            started: "2026-11-21T11:00:00Z".into(),
            keys: KeyCounts { accepted: 120, rejected: 1, pending: 4, deleted: 2 },
            health: local.clone(),
            peers: vec![
                peer("master-b", LinkState::Up, Some(b.clone())),
                peer("master-c", LinkState::Connecting, None),
            ],
            findings: crate::ops::findings::findings(&masters, &[]),
            conflicts: Vec::new(),
            held: Vec::new(),
            held_by_peers: Vec::new(),
            refused: Vec::new(),
            write_trouble: None,
            stale: None,
        };
        let cluster = cluster(&report);
        assert_eq!(cluster.masters.len(), 3);
        assert_eq!(cluster.masters[1].findings.len(), 3, "{:?}", cluster.masters[1]);
        let text = render(&cluster);
        for want in [
            "MASTER           LINK        LAST CONTACT  ACCEPTED  REJECTED  PENDING  DELETED  SALT     AGENT  FINDINGS",
            "master-a (this)  -           -             120       1         4        2        3008.3   0.2.0  warning salt-version, warning agent-version",
            "master-b         up          3s ago        120       1         0        2        3006.28  0.1.0  ERROR auto-accept, warning salt-version, warning agent-version",
            "master-c         connecting  never         ?         ?         ?        ?        ?        ?      -",
            "asked: master-a, salt-keysync 0.2.0, protocol 2",
            "ERROR    master-b accepts keys by itself (auto_accept: True): every key it accepts is accepted on every master by replication",
            "WARNING  the masters run different Salt versions: 3006.28 on master-b; 3008.3 on master-a",
            "WARNING  the agents run different salt-keysync versions: 0.1.0 on master-b; 0.2.0 on master-a; finish the upgrade",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        let json: ClusterReport = serde_json::from_str(&serde_json::to_string(&cluster).unwrap()).unwrap();
        assert_eq!(json, cluster);
    }
}
