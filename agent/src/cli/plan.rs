//! `salt-keysync plan`: asks the running agent what first contact does on
//! every master (it gathers the peers' answers) and prints one line per id
//! and master, as a table or as JSON.

use std::path::Path;
use std::time::Duration;

use crate::cli::status::{ask_json, StatusError};
use crate::ops::site_plan::{Shown, SitePlan};
use crate::text::shown;

/// The agent asks each peer within 10 s, at most twice.
const TIMEOUT: Duration = Duration::from_secs(40);

pub fn query(socket: &Path) -> Result<SitePlan, StatusError> {
    ask_json(socket, "plan", TIMEOUT)
}

/// `accepted 3f:a1:…`, `pending 3f:a1:…` or `nothing` (a peer's text: the
/// table shows it safely).
fn describe(what: &Shown) -> String {
    match &what.fingerprint {
        Some(fingerprint) => format!("{} {}…", what.state, fingerprint.chars().take(11).collect::<String>()),
        None => what.state.clone(),
    }
}

/// One line per id and master: what it holds, what it will show, and why;
/// masters that could not be asked first.
pub fn render(plan: &SitePlan) -> String {
    let mut out = String::new();
    for master in &plan.masters {
        let mode = if master.observe { "observe mode" } else { "normal mode" };
        match &master.error {
            Some(error) => out.push_str(&format!("{}: NOT ASKED: {}\n", shown(&master.node), shown(error))),
            None => out.push_str(&format!("{}: {mode}\n", shown(&master.node))),
        }
        if master.truncated {
            out.push_str(&format!(
                "{}: more rows than one answer carries; the rest are left out\n",
                shown(&master.node)
            ));
        }
    }
    let ids = plan.ids();
    if ids.is_empty() {
        out.push_str("\nno differences: every master holds the same, nothing will be written\n");
        return out;
    }
    let mut table = super::table::Table::new(["MINION", "MASTER", "HOLDS", "WILL", "WHY"]);
    for id in ids {
        for master in &plan.masters {
            let Some(row) = master.rows.iter().find(|r| r.minion == id) else { continue };
            let (holds, will) = (describe(&row.holds), describe(&row.will));
            let will = if row.will == row.holds { "(unchanged)".to_string() } else { will };
            let mut why = row.why.clone().unwrap_or_default();
            if row.conflict {
                why = if why.is_empty() { "CONFLICT".into() } else { format!("CONFLICT: {why}") };
            }
            table.row([row.minion.as_str(), &master.node, &holds, &will, &why]);
        }
    }
    out.push('\n');
    out.push_str(&table.render());
    let conflicts = plan
        .masters
        .iter()
        .flat_map(|m| m.rows.iter().filter(|r| r.conflict).map(|r| r.minion.as_str()))
        .collect::<std::collections::BTreeSet<_>>();
    if !conflicts.is_empty() {
        out.push_str(&format!(
            "\n{} conflict(s) no rule settles: masters keep different keys until an operator decides with salt-key \
             (accept the right key, or delete it, on any one master)\n",
            conflicts.len()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::site_plan::{Entry, MasterPlan};

    fn at(state: &str, fp: Option<&str>) -> Shown {
        Shown { state: state.into(), fingerprint: fp.map(str::to_string) }
    }

    #[test]
    fn one_line_per_id_and_master_with_what_changes_and_why() {
        let fp = "3f:a1:00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff:00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd";
        let row = |holds: Shown, will: Shown, why: Option<&str>| Entry {
            minion: "web01".into(),
            holds,
            will,
            conflict: false,
            why: why.map(str::to_string),
        };
        let plan = SitePlan {
            masters: vec![
                MasterPlan {
                    node: "master-a".into(),
                    observe: true,
                    error: None,
                    truncated: false,
                    rows: vec![row(
                        at("accepted", Some(fp)),
                        at("rejected", Some(fp)),
                        Some("a rejection beats an acceptance of the same key"),
                    )],
                },
                MasterPlan {
                    node: "master-b".into(),
                    observe: true,
                    error: None,
                    truncated: false,
                    rows: vec![row(at("rejected", Some(fp)), at("rejected", Some(fp)), None)],
                },
                MasterPlan {
                    node: "master-c\u{1b}[31m".into(),
                    observe: false,
                    error: Some("connecting: refused".into()),
                    truncated: false,
                    rows: vec![],
                },
            ],
        };
        let text = render(&plan);
        let lines: Vec<String> = text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
        let has = |want: &str| assert!(lines.iter().any(|l| l == want), "{want:?} not in {text}");
        has("web01 master-a accepted 3f:a1:00:11… rejected 3f:a1:00:11… a rejection beats an acceptance of the same key");
        has("web01 master-b rejected 3f:a1:00:11… (unchanged)");
        assert!(text.contains("NOT ASKED: connecting: refused"), "{text}");
        assert!(!text.contains('\u{1b}'), "a peer's name cannot drive the terminal: {text}");
    }

    /// Issue 30: the table counts characters, and a plan's cells hold
    /// others' ids and the "…" of a cut fingerprint (one character in three
    /// bytes): every row's cells start under their header.
    #[test]
    fn columns_line_up_whatever_the_ids_and_cut_fingerprints() {
        let fp = |byte: &str| format!("{byte}:a1:00:11:22:33:44:55");
        let entry = |minion: &str, holds: Shown, will: Shown, conflict: bool, why: Option<&str>| Entry {
            minion: minion.into(),
            holds,
            will,
            conflict,
            why: why.map(str::to_string),
        };
        let master = |node: &str, rows: Vec<Entry>| MasterPlan {
            node: node.into(),
            observe: true,
            error: None,
            truncated: false,
            rows,
        };
        let plan = SitePlan {
            masters: vec![
                master(
                    "master-a",
                    vec![
                        entry(
                            "wéb01",
                            at("accepted", Some(&fp("3f"))),
                            at("rejected", Some(&fp("3f"))),
                            false,
                            Some("a rule says so"),
                        ),
                        entry("ウェブ02", at("pending", Some(&fp("4d"))), at("pending", Some(&fp("4d"))), true, None),
                    ],
                ),
                master(
                    "mäster-b",
                    vec![entry(
                        "wéb01",
                        at("nothing", None),
                        at("rejected", Some(&fp("3f"))),
                        false,
                        Some("another rule"),
                    )],
                ),
            ],
        };
        let text = render(&plan);
        // The character (not byte) where `cell` starts in `line`.
        let column_of = |line: &str, cell: &str| {
            line[..line.find(cell).unwrap_or_else(|| panic!("{cell:?}: {text}"))].chars().count()
        };
        let header = text.lines().find(|l| l.starts_with("MINION")).unwrap();
        assert_eq!(header, "MINION  MASTER    HOLDS                  WILL                   WHY", "{text}");
        let rows: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("MINION")).skip(1).take(3).collect();
        for (row, cells) in rows.iter().zip([
            ["master-a", "accepted 3f:a1:00:11…", "rejected 3f:a1:00:11…", "a rule says so"],
            ["mäster-b", "nothing", "rejected 3f:a1:00:11…", "another rule"],
            ["master-a", "pending 4d:a1:00:11…", "(unchanged)", "CONFLICT"],
        ]) {
            for (cell, column) in cells.iter().zip(["MASTER", "HOLDS", "WILL", "WHY"]) {
                assert_eq!(column_of(row, cell), column_of(header, column), "{cell:?} under {column}:\n{text}");
            }
        }
    }
}
