//! `salt-keysync status`: asks the running agent over its control socket
//! and prints what it knows, as a table or as JSON. (`ask` is also how
//! `salt-keysync reload` talks to it.)

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::disk::health::UNSET;
use crate::ops::board::{LinkState, PeerStatus, StatusReport};
use crate::ops::findings::agent_version;

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    // Not "salt-keysync is …": the binary prints every error after "salt-keysync: ".
    #[error("the agent is not running (no control socket at {0}): start it with `systemctl start salt-keysync`")]
    NotRunning(String),
    #[error("the agent is not running (nothing answers on {0}, left by an agent that was killed): start it with `systemctl start salt-keysync`")]
    Stale(String),
    #[error("cannot reach the agent at {path}: {cause} (run status as the agent's user, usually root)")]
    Denied { path: String, cause: std::io::Error },
    #[error("the agent at {path} did not answer: {message}")]
    NoAnswer { path: String, message: String },
    /// It answered with an error of its own (`{"error": …}`): it is
    /// starting, or what was asked is not there.
    #[error("{0}")]
    Said(String),
}

/// Asks the agent listening on `socket` for its status.
pub fn query(socket: &Path) -> Result<StatusReport, StatusError> {
    ask_json(socket, "status", TIMEOUT)
}

/// Sends `request` and reads the agent's one-line JSON answer.
pub fn ask_json<T: serde::de::DeserializeOwned>(
    socket: &Path,
    request: &str,
    timeout: Duration,
) -> Result<T, StatusError> {
    let line = ask_with(socket, request, timeout)?;
    serde_json::from_str(&line).map_err(|e| match said(&line) {
        Some(message) => StatusError::Said(message),
        None => StatusError::NoAnswer {
            path: socket.display().to_string(),
            message: format!("unreadable reply ({e}): {}", line.trim()),
        },
    })
}

/// The agent's own error, when its answer is `{"error": "…"}` and nothing more.
fn said(line: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let object = value.as_object().filter(|o| o.len() == 1)?;
    object.get("error")?.as_str().map(str::to_string)
}

/// Sends one `request` line to the agent listening on `socket`; its one-line answer.
pub fn ask(socket: &Path, request: &str) -> Result<String, StatusError> {
    ask_with(socket, request, TIMEOUT)
}

/// [`ask`], waiting at most `timeout` for the answer.
pub fn ask_with(socket: &Path, request: &str, timeout: Duration) -> Result<String, StatusError> {
    let path = socket.display().to_string();
    let mut stream = UnixStream::connect(socket).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => StatusError::NotRunning(path.clone()),
        std::io::ErrorKind::ConnectionRefused => StatusError::Stale(path.clone()),
        _ => StatusError::Denied { path: path.clone(), cause: source },
    })?;
    let no_answer = |message: String| StatusError::NoAnswer { path: path.clone(), message };
    stream.set_read_timeout(Some(timeout)).map_err(|e| no_answer(e.to_string()))?;
    stream.set_write_timeout(Some(timeout)).map_err(|e| no_answer(e.to_string()))?;
    stream.write_all(format!("{request}\n").as_bytes()).map_err(|e| no_answer(e.to_string()))?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).map_err(|e| no_answer(e.to_string()))?;
    Ok(line)
}

/// The human-readable form: summary lines, then one row per peer, then
/// drift and anti-entropy details.
pub fn render(report: &StatusReport) -> String {
    let report = &shown_report(report);
    let now = parse_time(&report.now);
    let ago = |time: &Option<String>| ago(now, time);
    let mut out = String::new();
    let k = &report.keys;
    let protocol = report.protocol_version.map_or(String::new(), |p| format!(", protocol {p}"));
    out.push_str(&format!(
        "node      {} (salt-keysync {}{protocol}, started {})\n",
        report.node, report.version, report.started
    ));
    out.push_str(&format!(
        "keys      {} accepted, {} rejected, {} pending, {} deleted (tombstones)\n",
        k.accepted, k.rejected, k.pending, k.deleted
    ));
    out.push_str(&format!(
        "master    master.pub {}, salt-master {}\n",
        report.health.master_pub.as_deref().unwrap_or("unknown"),
        report.health.salt_version.as_deref().unwrap_or("unknown")
    ));
    for error in &report.health.errors {
        out.push_str(&format!("          ! {error}\n"));
    }
    out.push('\n');
    let mut table = super::table::Table::new([
        "PEER",
        "STATE",
        "LAST CONTACT",
        "LACKS FROM US",
        "WE LACK",
        "MASTER.PUB",
        "SETTINGS",
        "SALT",
        "AGENT",
    ]);
    for peer in &report.peers {
        let (they_lack, we_lack) = match &peer.anti_entropy {
            Some(run) => (run.peer_lacked.to_string(), run.we_lacked.to_string()),
            None => ("?".into(), "?".into()),
        };
        table.row([
            peer.name.clone(),
            peer.state.to_string(),
            ago(&peer.last_contact),
            they_lack,
            we_lack,
            master_pub_cell(peer),
            settings_cell(peer),
            peer.health.as_ref().and_then(|h| h.salt_version.clone()).unwrap_or_else(|| "?".into()),
            agent_version(peer.health.as_ref()).unwrap_or_else(|| "?".into()),
        ]);
    }
    out.push_str(&table.render());
    out.push_str("\n(lacks: counts from the last anti-entropy digest comparison with that peer)\n");
    for peer in &report.peers {
        if peer.state != LinkState::Up {
            if let Some(error) = &peer.last_error {
                out.push_str(&format!("{}: {} — {error}\n", peer.name, peer.state));
            }
        }
        if let Some(run) = &peer.anti_entropy {
            out.push_str(&format!(
                "{}: anti-entropy {}: {} differing buckets, it lacked {}, this master {} ({} applied), {} B sent, {} B received\n",
                peer.name,
                ago(&Some(run.at.clone())),
                run.differing_buckets,
                run.peer_lacked,
                run.we_lacked,
                run.applied,
                run.bytes_sent,
                run.bytes_received
            ));
        }
        if peer.drift.master_pub_mismatch {
            let theirs = peer.health.as_ref().and_then(|h| h.master_pub.as_deref()).unwrap_or("?");
            out.push_str(&format!(
                "{}: MASTER KEY MISMATCH: its master.pub is {theirs}; every master must share one master.pem/master.pub\n",
                peer.name
            ));
        }
        if !peer.drift.settings.is_empty() {
            out.push_str(&format!(
                "{}: SETTINGS DRIFT: {} not the same as on this master (Salt's multi-master set-up needs them equal)\n",
                peer.name,
                peer.drift.settings.join(", ")
            ));
        }
    }
    // Mismatch and drift are told per peer above; these concern the site.
    for finding in report
        .findings
        .iter()
        .filter(|f| matches!(f.kind.as_str(), "auto-accept" | "salt-version" | "agent-version" | "clock"))
    {
        out.push_str(&format!("{}: {}\n", finding.level.to_string().to_uppercase(), finding.message));
    }
    if let Some(trouble) = &report.write_trouble {
        out.push_str(&format!("ERROR: {trouble}\n"));
    }
    if let Some(stale) = &report.stale {
        out.push_str(&format!("ERROR: {stale}\n"));
    }
    for burst in &report.held {
        let more = if burst.count > burst.first.len() { ", …" } else { "" };
        out.push_str(&format!(
            "HELD DELETES: {} from {} since {} ({}{more}): a mass delete the guard keeps from this master's keys; \
             `salt-keysync held` lists them, `salt-keysync release --origin {}` applies them here, \
             `salt-keysync revert --origin {}` restores the keys on {}\n",
            burst.count,
            burst.origin,
            burst.since,
            burst.first.join(", "),
            burst.origin,
            burst.origin,
            burst.origin
        ));
    }
    render_guard(report, &mut out);
    if !report.conflicts.is_empty() {
        out.push_str(&format!(
            "CONFLICTS: {} id(s) whose masters keep different keys until an operator decides with salt-key \
             (`salt-keysync plan` shows every master):\n",
            report.conflicts.len()
        ));
        for conflict in report.conflicts.iter().take(MAX_CONFLICTS_SHOWN) {
            let shows = match &conflict.will.fingerprint {
                Some(fp) => format!("{} {}", conflict.will.state, fp),
                None => conflict.will.state.clone(),
            };
            out.push_str(&format!("  {}: this master shows {shows}\n", conflict.minion));
        }
        if report.conflicts.len() > MAX_CONFLICTS_SHOWN {
            out.push_str(&format!(
                "  … and {} more (--json lists them all)\n",
                report.conflicts.len() - MAX_CONFLICTS_SHOWN
            ));
        }
    }
    out
}

/// Conflicts listed by the table (`--json` has them all).
const MAX_CONFLICTS_SHOWN: usize = 20;

/// The exit status of `status` and `status --cluster` when the agent
/// answered and a finding is an error (0: none is; 1: the agent could not
/// be asked; 2, as for every command: wrong arguments).
pub const EXIT_ERROR_FINDING: i32 = 3;

/// Issue 28 item 2: this master's deletes that peers say they hold, what
/// peers say they hold of other masters' deletes, and the decisions peers
/// sent that were refused here (the deletes held here are `HELD DELETES`).
fn render_guard(report: &StatusReport, out: &mut String) {
    if !report.held_by_peers.is_empty() {
        let told: Vec<String> = report
            .held_by_peers
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let of = if i == 0 { " of this master's deletes" } else { "" };
                format!("{} says it holds {}{of}", h.peer, h.count)
            })
            .collect();
        out.push_str(&format!(
            "HELD BY PEERS: {} (see `salt-keysync held` there; `revert` or `release` there)\n",
            told.join(", ")
        ));
    }
    let others = |f: &&crate::ops::findings::Finding| match f.kind.as_str() {
        "held-by-peer" => f.masters.get(1) != Some(&report.node),
        "clock-refused" | "refused" => true,
        _ => false,
    };
    for finding in report.findings.iter().filter(others) {
        out.push_str(&format!("{}: {}\n", finding.level.to_string().to_uppercase(), finding.message));
    }
}

/// The report with every text in it shown safely (`text.rs`): peer names,
/// errors and health come from others. Every field, whatever the report
/// holds, through its JSON form.
fn shown_report(report: &StatusReport) -> StatusReport {
    shown(report)
}

/// `value` with every text in it shown safely, through its JSON form.
pub(crate) fn shown<T: serde::Serialize + serde::de::DeserializeOwned + Clone>(report: &T) -> T {
    fn walk(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::String(text) => *text = crate::text::shown(text).into_owned(),
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            serde_json::Value::Object(fields) => fields.values_mut().for_each(walk),
            _ => {}
        }
    }
    let Ok(mut value) = serde_json::to_value(report) else { return report.clone() };
    walk(&mut value);
    serde_json::from_value(value).unwrap_or_else(|_| report.clone())
}

/// `5s ago`, or `never`.
pub(crate) fn ago(now: Option<i64>, time: &Option<String>) -> String {
    match (time.as_deref().and_then(parse_time), now) {
        (Some(t), Some(now)) => {
            format!("{} ago", humantime::format_duration(Duration::from_secs((now - t).max(0) as u64)))
        }
        _ => "never".to_string(),
    }
}

fn master_pub_cell(peer: &PeerStatus) -> String {
    match (&peer.health, peer.drift.master_pub_mismatch) {
        (_, true) => "MISMATCH".into(),
        (Some(health), false) if health.master_pub.is_some() => "same".into(),
        _ => "unknown".into(),
    }
}

fn settings_cell(peer: &PeerStatus) -> String {
    match &peer.health {
        _ if !peer.drift.settings.is_empty() => format!("DRIFT: {}", peer.drift.settings.join(",")),
        Some(health) if !health.settings.is_empty() => {
            let n_set = health.settings.values().filter(|v| *v != UNSET).count();
            format!("same ({n_set} set)")
        }
        _ => "unknown".into(),
    }
}

pub(crate) fn parse_time(text: &str) -> Option<i64> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok().map(|t| t.unix_timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::health::{Drift, MasterHealth};
    use crate::ops::board::{AntiEntropyRun, KeyCounts};
    use crate::ops::findings::{Finding, Level};

    /// An agent's own error is told as it said it; anything else unreadable
    /// is shown whole.
    #[test]
    fn an_answer_that_is_an_error_is_told_as_the_agent_said_it() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("control.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let agent = std::thread::spawn(move || {
            for reply in [r#"{"error":"the agent is starting"}"#, r#"{"error":"x","more":1}"#] {
                let (mut stream, _) = listener.accept().unwrap();
                BufReader::new(&stream).read_line(&mut String::new()).unwrap();
                stream.write_all(format!("{reply}\n").as_bytes()).unwrap();
            }
        });
        let said = query(&socket).unwrap_err();
        assert!(matches!(&said, StatusError::Said(m) if m == "the agent is starting"), "{said:?}");
        let unreadable = query(&socket).unwrap_err().to_string();
        assert!(unreadable.contains(r#"unreadable reply"#) && unreadable.contains(r#""more":1"#), "{unreadable}");
        agent.join().unwrap();
    }

    /// A report with two peers, findings, a conflict, a held burst and write trouble.
    fn sample() -> StatusReport {
        let peer = |name: &str, state: LinkState| PeerStatus {
            name: name.into(),
            address: "10.0.0.2:4515".into(),
            state,
            last_error: None,
            last_contact: Some("2026-11-21T12:00:00Z".into()),
            anti_entropy: None,
            health: None,
            drift: Drift::default(),
            holds: Vec::new(),
            clock: None,
        };
        StatusReport {
            node: "master-a".into(),
            version: "0.2.0".into(),
            protocol_version: Some(2),
            now: "2026-11-21T12:00:05Z".into(),
            started: "2026-11-21T11:00:00Z".into(),
            keys: KeyCounts { accepted: 3, rejected: 1, pending: 2, deleted: 4 },
            health: MasterHealth {
                master_pub: Some("aa:bb".into()),
                salt_version: Some("3008.3".into()),
                ..MasterHealth::default()
            },
            peers: vec![
                PeerStatus {
                    anti_entropy: Some(AntiEntropyRun { peer_lacked: 7, we_lacked: 2, ..AntiEntropyRun::default() }),
                    health: Some(MasterHealth {
                        master_pub: Some("cc:dd".into()),
                        salt_version: Some("3006.28".into()),
                        ..MasterHealth::default()
                    }),
                    drift: Drift { master_pub_mismatch: true, settings: vec!["publisher_acl".into()] },
                    ..peer("master-b", LinkState::Up)
                },
                PeerStatus { last_error: Some("connection refused".into()), ..peer("master-c", LinkState::Down) },
            ],
            findings: vec![
                Finding {
                    level: Level::Error,
                    kind: "auto-accept".into(),
                    masters: vec!["master-b".into()],
                    message: "master-b accepts keys by itself (open_mode: True): …".into(),
                },
                Finding {
                    level: Level::Warning,
                    kind: "agent-version".into(),
                    masters: vec!["master-b".into(), "master-a".into()],
                    message: "the agents run different salt-keysync versions: 0.1.0 on master-b; 0.2.0 on master-a; …"
                        .into(),
                },
            ],
            conflicts: vec![crate::ops::site_plan::Entry {
                minion: "web01".into(),
                holds: crate::ops::site_plan::Shown { state: "accepted".into(), fingerprint: Some("3f:a1".into()) },
                will: crate::ops::site_plan::Shown { state: "accepted".into(), fingerprint: Some("3f:a1".into()) },
                conflict: true,
                why: None,
            }],
            held: vec![crate::ops::held::HeldBurst {
                origin: "master-c".into(),
                count: 302,
                since: "2026-11-21T11:59:58Z".into(),
                first: vec!["web001".into(), "web002".into()],
            }],
            held_by_peers: Vec::new(),
            refused: Vec::new(),
            write_trouble: Some(crate::ops::sd_notify::write_trouble(
                std::time::Duration::from_secs(125),
                "state store, for decisions: No space left on device (os error 28)",
            )),
            stale: Some(crate::ops::sd_notify::stale(&keysync_machine::node::Stale {
                last_contact_ms: 1_760_000_000_000,
                peer: keysync_machine::testkit::peer("master-b"),
                peer_forgot_ms: 1_760_000_000_000 + 5 * 86_400_000,
            })),
        }
    }

    #[test]
    fn table_shows_state_lag_and_drift() {
        let report = sample();
        let mut forged = report.clone();
        forged.peers[1].last_error = Some("refused\nmaster-x  up  1s ago\u{1b}[8m".into());
        let forged = render(&forged);
        assert!(forged.contains("refused\\u{a}master-x  up  1s ago\\u{1b}[8m"), "{forged}");
        assert!(!forged.chars().any(|c| c.is_control() && c != '\n'), "{forged:?}");
        let text = render(&report);
        for want in [
            "node      master-a (salt-keysync 0.2.0, protocol 2, started 2026-11-21T11:00:00Z)",
            "SETTINGS              SALT     AGENT",
            "3 accepted, 1 rejected, 2 pending, 4 deleted",
            "master-b  up     5s ago",
            "master    master.pub aa:bb, salt-master 3008.3",
            // master-b reported without an agent version: 0.1.0.
            "7              2        MISMATCH    DRIFT: publisher_acl  3006.28  0.1.0",
            "master-c  down   5s ago        ?              ?        unknown     unknown               ?        ?",
            "WARNING: the agents run different salt-keysync versions: 0.1.0 on master-b; 0.2.0 on master-a",
            "ERROR: master-b accepts keys by itself (open_mode: True)",
            "CONFLICTS: 1 id(s) whose masters keep different keys",
            "  web01: this master shows accepted 3f:a1",
            "HELD DELETES: 302 from master-c since 2026-11-21T11:59:58Z (web001, web002, …)",
            "salt-keysync release --origin master-c` applies them here",
            "ERROR: writes failing for 2m 5s: state store, for decisions: No space left on device (os error 28); \
             nothing recorded",
            "ERROR: out of contact with every peer since 2025-10-09T08:53:20Z: master-b has since forgotten deletes \
             made up to 2025-10-14T08:53:20Z",
            "`salt-keysync rejoin` sets aside",
            "master-c: down — connection refused",
            "master-b: MASTER KEY MISMATCH: its master.pub is cc:dd",
            "master-b: SETTINGS DRIFT: publisher_acl",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
    }

    /// Issue 28 item 2: this master's deletes held by peers on one line;
    /// what peers hold of another master's deletes, and refusals, each on its own.
    #[test]
    fn deletes_held_by_peers_and_refusals_are_told() {
        let mut report = sample();
        report.held_by_peers = vec![
            crate::ops::held::HeldByPeer { peer: "master-b".into(), count: 20 },
            crate::ops::held::HeldByPeer { peer: "master-c".into(), count: 19 },
        ];
        let finding = |level, kind: &str, masters: [&str; 2], message: &str| Finding {
            level,
            kind: kind.into(),
            masters: masters.iter().map(|m| m.to_string()).collect(),
            message: message.into(),
        };
        report.findings = vec![
            finding(Level::Error, "held-by-peer", ["master-b", "master-a"], "master-b says it holds 20 of this …"),
            finding(
                Level::Error,
                "held-by-peer",
                ["master-b", "master-d"],
                "master-b says it holds 3 deletes made on master-d",
            ),
            finding(Level::Warning, "clock-refused", ["master-c", ""], "master-c sent 2 decisions made in the future"),
            finding(Level::Warning, "refused", ["master-c", ""], "master-c sent 1 decision refused\u{1b}[8m"),
        ];
        let text = render(&report);
        for want in [
            "HELD BY PEERS: master-b says it holds 20 of this master's deletes, master-c says it holds 19 (see \
             `salt-keysync held` there; `revert` or `release` there)\n",
            "ERROR: master-b says it holds 3 deletes made on master-d\n",
            "WARNING: master-c sent 2 decisions made in the future\n",
            "WARNING: master-c sent 1 decision refused\\u{1b}[8m\n",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        assert!(!text.contains("holds 20 of this …"), "told once, on the HELD BY PEERS line:\n{text}");
    }

    /// Issue 28 item 8: widths are counted in characters, not bytes: a peer
    /// named with "é" or in kana makes its column as wide as the name has
    /// characters ("マスター-c" is 6, in 14 bytes), and the rows line up.
    #[test]
    fn columns_are_measured_in_characters_whatever_the_names() {
        let mut report = sample();
        report.peers[0].name = "mästér-b".into();
        report.peers[1].name = "マスター-c".into();
        let text = render(&report);
        let at = |line: &str, cell: &str| line[..line.find(cell).unwrap()].chars().count();
        let line = |start: &str| text.lines().find(|l| l.starts_with(start)).unwrap();
        let (header, b, c) = (line("PEER"), line("mästér-b"), line("マスター-c"));
        assert_eq!(at(header, "STATE"), "mästér-b".chars().count() + 2, "{text}");
        assert_eq!((at(b, "up"), at(c, "down")), (at(header, "STATE"), at(header, "STATE")), "{text}");
        assert_eq!((at(b, "5s ago"), at(c, "5s ago")), (at(header, "LAST"), at(header, "LAST")), "{text}");
    }
}
