//! `salt-keysync held`, `release` and `revert`: what the blast-radius guard
//! holds on this master, and the operator's way to end it — applying the
//! deletes everywhere, or restoring the keys on the master they were
//! deleted on. Asked of the running agent over its control socket.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::ops::held::{HeldList, OperatorReply, OperatorRequest};

/// A release of many ids writes and syncs them first.
const OPERATOR_TIMEOUT: Duration = Duration::from_secs(120);
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the guard holds on the agent listening on `socket`.
pub fn query(socket: &Path) -> Result<HeldList> {
    Ok(crate::cli::status::ask_json(socket, "held", LIST_TIMEOUT)?)
}

/// The table `salt-keysync held` prints.
pub fn render(list: &HeldList) -> String {
    let list = crate::cli::status::shown(list);
    if list.held.is_empty() {
        return format!("{}: no deletes held\n", list.node);
    }
    let mut out = String::new();
    for burst in &list.bursts {
        out.push_str(&format!(
            "{}: {} deletes from {} held since {}\n",
            list.node, burst.count, burst.origin, burst.since
        ));
    }
    out.push('\n');
    let mut table = super::table::Table::new(["MINION", "ORIGIN", "VIA", "HELD SINCE"]);
    for held in &list.held {
        table.row([&held.minion, &held.origin, &held.via, &held.since]);
    }
    out.push_str(&table.render());
    out.push_str(
        "\n`salt-keysync release [--origin NAME] [ID...]` applies them on every master;\n\
         `salt-keysync revert [--origin NAME] [ID...]` restores the keys on the master they were deleted on.\n",
    );
    out
}

/// Asks the agent to release or revert (`action`: "release" or "revert").
pub fn operate(socket: &Path, action: &str, origin: Option<String>, ids: Vec<String>) -> Result<OperatorReply> {
    let request = OperatorRequest { origin, ids };
    let line = format!("{action} {}", serde_json::to_string(&request)?);
    let reply: OperatorReply = crate::cli::status::ask_json(socket, &line, OPERATOR_TIMEOUT)?;
    if let Some(error) = &reply.error {
        bail!("{action} refused: {}", crate::text::shown(error));
    }
    if reply.done.is_empty() && reply.retrying.is_empty() && reply.skipped.is_empty() {
        bail!("nothing held here matches (`salt-keysync held` lists what is held)");
    }
    Ok(reply)
}

/// What `release` and `revert` print.
pub fn render_reply(reply: &OperatorReply) -> String {
    let reply = crate::cli::status::shown(reply);
    let what = match reply.action.as_str() {
        "release" => {
            "released: deleted here and sent to the peers; a peer whose guard holds them too holds them until \
             its own operator releases them there"
        }
        _ => "reverted: accepted again everywhere, the master they were deleted on included",
    };
    let mut out = format!("{} {what}\n", reply.done.len());
    if !reply.retrying.is_empty() {
        out.push_str(&format!(
            "{} more: writes fail on this master; retried until they succeed (see `salt-keysync status`)\n",
            reply.retrying.len()
        ));
    }
    if !reply.skipped.is_empty() {
        out.push_str(&format!(
            "{} still held: a salt-key run is working on them here, or their files changed and the change is not \
             recorded yet ({}); run the command again\n",
            reply.skipped.len(),
            reply.skipped.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::held::{HeldBurst, HeldEntry};

    #[test]
    fn the_table_names_origin_and_way_out_and_shows_no_control_character() {
        let list = HeldList {
            node: "master-b".into(),
            bursts: vec![HeldBurst {
                origin: "master-a".into(),
                count: 2,
                since: "2026-11-24T10:00:00Z".into(),
                first: vec!["web01".into()],
            }],
            held: vec![
                HeldEntry {
                    minion: "web01\n\u{1b}[8m".into(),
                    origin: "master-a".into(),
                    via: "master-a".into(),
                    since: "2026-11-24T10:00:00Z".into(),
                    version: "1.0@master-a".into(),
                },
                HeldEntry {
                    minion: "web02".into(),
                    origin: "master-a".into(),
                    via: "master-c".into(),
                    since: "2026-11-24T10:00:01Z".into(),
                    version: "1.1@master-a".into(),
                },
            ],
        };
        let text = render(&list);
        assert!(text.contains("master-b: 2 deletes from master-a held since 2026-11-24T10:00:00Z"), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with("web02 ") && l.ends_with("master-a  master-c  2026-11-24T10:00:01Z")),
            "{text}"
        );
        assert!(text.contains("salt-keysync release") && text.contains("salt-keysync revert"), "{text}");
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
        let empty = HeldList { node: "master-b".into(), bursts: vec![], held: vec![] };
        assert_eq!(render(&empty), "master-b: no deletes held\n");
        let reply = OperatorReply {
            action: "revert".into(),
            done: vec!["web01".into()],
            retrying: vec![],
            skipped: vec!["web02".into()],
            error: None,
        };
        let text = render_reply(&reply);
        assert!(text.starts_with("1 reverted") && text.contains("1 still held") && text.contains("web02"), "{text}");
    }

    /// Issue 28 item 8: widths are counted in characters, not bytes
    /// ("ウェブ02" is 5 characters in 11 bytes).
    #[test]
    fn columns_are_measured_in_characters_whatever_the_ids() {
        let entry = |minion: &str| HeldEntry {
            minion: minion.into(),
            origin: "master-a".into(),
            via: "master-c".into(),
            since: "2026-11-24T10:00:01Z".into(),
            version: "1.1@master-a".into(),
        };
        let list = HeldList {
            node: "master-b".into(),
            bursts: vec![],
            held: vec![entry("wéb01"), entry("ウェブ02"), entry("web03")],
        };
        let text = render(&list);
        let at = |line: &str, cell: &str| line[..line.find(cell).unwrap()].chars().count();
        let header = text.lines().find(|l| l.starts_with("MINION")).unwrap();
        assert_eq!(at(header, "ORIGIN"), "MINION".len() + 2, "{text}");
        for id in ["wéb01", "ウェブ02", "web03"] {
            let row = text.lines().find(|l| l.starts_with(id)).unwrap();
            assert_eq!(at(row, "master-a"), at(header, "ORIGIN"), "{text}");
            assert_eq!(at(row, "2026-"), at(header, "HELD SINCE"), "{text}");
        }
    }
}
