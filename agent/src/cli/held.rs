//! `salt-keysync held`, `release` and `revert`: what the blast-radius guard
//! holds on this master, and the operator's way to end it — applying the
//! deletes everywhere, or restoring the keys on the master they were
//! deleted on. Asked of the running agent over its control socket.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};

use serde::{Deserialize, Serialize};

use crate::ops::held::{HeldEntry, HeldList, OperatorReply, OperatorRequest};

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

/// What `release` or `revert` will do: the held deletes it names, as
/// `held` listed them a moment before (`--dry-run --json` prints it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// "release" or "revert".
    pub action: String,
    pub dry_run: bool,
    /// `--origin`, if given.
    pub origin: Option<String>,
    /// The held deletes it acts on, by minion id.
    pub held: Vec<HeldEntry>,
    /// Ids named on the command line that nothing held here matches.
    pub not_held: Vec<String>,
}

/// Ids of a plan listed in full; past this, the first few per origin.
const LISTED_IN_FULL: usize = 20;
/// Ids named per origin in a longer plan.
const FIRST_IDS: usize = 5;
/// Ids per request on the control socket: each request is one round of
/// decisions, and its line stays far below the socket's limit.
const IDS_PER_REQUEST: usize = 1_000;

/// The held deletes of `list` that `release` or `revert` (`action`) names:
/// from `origin` if given, of `ids` if any are given (as the agent selects).
pub fn plan(list: &HeldList, action: &str, origin: Option<&str>, ids: &[String], dry_run: bool) -> Plan {
    let mut held: Vec<HeldEntry> = list
        .held
        .iter()
        .filter(|h| origin.is_none_or(|o| h.origin == o))
        .filter(|h| ids.is_empty() || ids.contains(&h.minion))
        .cloned()
        .collect();
    held.sort_by(|a, b| a.minion.cmp(&b.minion));
    let mut not_held: Vec<String> = ids.iter().filter(|id| !held.iter().any(|h| &h.minion == *id)).cloned().collect();
    not_held.sort();
    not_held.dedup();
    Plan { action: action.to_string(), dry_run, origin: origin.map(str::to_string), held, not_held }
}

/// The plan for a person: the held deletes per origin (every id when there
/// are few), the ids not held, and what the command does with them.
pub fn render_plan(plan: &Plan) -> String {
    let plan = crate::cli::status::shown(plan);
    let mut by_origin: std::collections::BTreeMap<&str, Vec<&HeldEntry>> = Default::default();
    for held in &plan.held {
        by_origin.entry(held.origin.as_str()).or_default().push(held);
    }
    let deletes = |n: usize| if n == 1 { "1 held delete".to_string() } else { format!("{n} held deletes") };
    let mut out = format!("{} {}:\n", plan.action, deletes(plan.held.len()));
    for (origin, held) in &by_origin {
        let since = held.iter().map(|h| h.since.as_str()).min().unwrap_or("?");
        out.push_str(&format!("  {} from {origin} since {since}", deletes(held.len())));
        if plan.held.len() > LISTED_IN_FULL {
            let first: Vec<&str> = held.iter().take(FIRST_IDS).map(|h| h.minion.as_str()).collect();
            let more = if held.len() > FIRST_IDS { ", …" } else { "" };
            out.push_str(&format!(" ({}{more})\n", first.join(", ")));
        } else {
            out.push('\n');
        }
    }
    if plan.held.len() <= LISTED_IN_FULL {
        let mut table = super::table::Table::new(["    MINION", "ORIGIN", "VIA", "HELD SINCE"]);
        for held in &plan.held {
            table.row([format!("    {}", held.minion), held.origin.clone(), held.via.clone(), held.since.clone()]);
        }
        out.push_str(&table.render());
    }
    if !plan.not_held.is_empty() {
        out.push_str(&format!("  not held here (left alone): {}\n", plan.not_held.join(", ")));
    }
    out.push_str(match plan.action.as_str() {
        "release" => {
            "release: each becomes a delete from this master, applied here (the key removed, .dfn dropped so the \
             master rotates its AES key) and sent to every peer; a peer whose guard holds them too holds them \
             until its own operator releases them there\n"
        }
        _ => {
            "revert: each becomes an accept, from this master, of the key it holds, which wins on every master: \
             the master they were deleted on writes the keys back\n"
        }
    });
    out
}

/// The question `salt-key` asks before the same kind of change: a delete
/// defaults to no (`salt-key -d`), an accept to yes (`salt-key -a`).
pub fn question(action: &str) -> &'static str {
    match action {
        "release" => "Proceed? [N/y] ",
        _ => "Proceed? [n/Y] ",
    }
}

/// Reads the answer to [`question`] from `input`: `y…` goes on; an empty
/// line takes the default (no for `release`, yes for `revert`); anything
/// else, or the end of the input, does not.
pub fn answered_yes(action: &str, input: &mut impl std::io::BufRead) -> bool {
    let mut line = String::new();
    match input.read_line(&mut line) {
        Ok(0) | Err(_) => false,
        Ok(_) => {
            let answer = line.trim();
            answer.starts_with(['y', 'Y']) || (answer.is_empty() && action == "revert")
        }
    }
}

/// Asks the agent to release or revert (`action`: "release" or "revert")
/// exactly the held deletes of `plan` (a few requests for many ids), and
/// puts their replies together.
pub fn operate(socket: &Path, plan: &Plan) -> Result<OperatorReply> {
    let action = plan.action.as_str();
    let mut all = OperatorReply { action: action.to_string(), ..OperatorReply::default() };
    for chunk in plan.held.chunks(IDS_PER_REQUEST) {
        let ids = chunk.iter().map(|h| h.minion.clone()).collect();
        let request = OperatorRequest { origin: plan.origin.clone(), ids };
        let line = format!("{action} {}", serde_json::to_string(&request)?);
        let reply: OperatorReply = crate::cli::status::ask_json(socket, &line, OPERATOR_TIMEOUT)?;
        if let Some(error) = &reply.error {
            if all.done.is_empty() && all.retrying.is_empty() {
                bail!("{action} refused: {}", crate::text::shown(error));
            }
            bail!(
                "{action} refused after {} of {} were done: {}",
                all.done.len() + all.retrying.len(),
                plan.held.len(),
                crate::text::shown(error)
            );
        }
        all.done.extend(reply.done);
        all.retrying.extend(reply.retrying);
        all.skipped.extend(reply.skipped);
    }
    Ok(all)
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

    fn entry(minion: &str, origin: &str) -> HeldEntry {
        HeldEntry {
            minion: minion.into(),
            origin: origin.into(),
            via: origin.into(),
            since: "2026-11-24T10:00:00Z".into(),
            version: format!("1.0@{origin}"),
        }
    }

    /// Issue 28 item 2: what `release` and `revert` will do, as `held`
    /// listed it: selected as the agent selects, every id when few, the
    /// first ids per origin when many.
    #[test]
    fn the_plan_names_what_is_held_and_what_is_not() {
        let held: Vec<HeldEntry> = (0..30)
            .map(|i| entry(&format!("web{:02}", 29 - i), if i % 3 == 0 { "master-c" } else { "master-a" }))
            .collect();
        let list = HeldList { node: "master-b".into(), bursts: vec![], held };
        let all = plan(&list, "release", None, &[], false);
        assert_eq!(all.held.len(), 30);
        assert!(all.held.windows(2).all(|w| w[0].minion < w[1].minion), "by id");
        let text = render_plan(&all);
        assert!(text.starts_with("release 30 held deletes:\n"), "{text}");
        assert!(
            text.contains(
                "  20 held deletes from master-a since 2026-11-24T10:00:00Z (web00, web01, web03, web04, web06, …)\n"
            ),
            "{text}"
        );
        assert!(text.contains("  10 held deletes from master-c since 2026-11-24T10:00:00Z (web02, web05,"), "{text}");
        assert!(!text.contains("MINION"), "many: no table: {text}");
        assert!(text.contains("release: each becomes a delete from this master"), "{text}");

        let ids: Vec<String> = ["web01", "web02", "web99", "web01"].map(String::from).to_vec();
        let some = plan(&list, "revert", Some("master-a"), &ids, true);
        let minions: Vec<&str> = some.held.iter().map(|h| h.minion.as_str()).collect();
        assert_eq!(minions, ["web01"], "of master-a only");
        assert_eq!(some.not_held, ["web02", "web99"]);
        assert_eq!((some.origin.as_deref(), some.dry_run), (Some("master-a"), true));
        let text = render_plan(&some);
        assert!(text.starts_with("revert 1 held delete:\n  1 held delete from master-a since"), "{text}");
        assert!(text.lines().any(|l| l.starts_with("    web01") && l.contains("master-a")), "few: every id: {text}");
        assert!(text.contains("  not held here (left alone): web02, web99\n"), "{text}");
        assert!(text.contains("revert: each becomes an accept"), "{text}");
        assert!(plan(&list, "release", Some("master-x"), &[], false).held.is_empty());
    }

    /// As salt-key asks: a delete defaults to no, an accept to yes; the end
    /// of the input is no answer, and does nothing.
    #[test]
    fn the_question_and_its_answers_are_salt_keys() {
        assert_eq!((question("release"), question("revert")), ("Proceed? [N/y] ", "Proceed? [n/Y] "));
        let answer = |action: &str, input: &str| answered_yes(action, &mut input.as_bytes());
        for (input, release, revert) in [
            ("y\n", true, true),
            ("Yes\n", true, true),
            ("\n", false, true),
            ("n\n", false, false),
            ("sure\n", false, false),
            ("", false, false),
        ] {
            assert_eq!((answer("release", input), answer("revert", input)), (release, revert), "{input:?}");
        }
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
