//! `salt-keysync audit`: review the audit log (table or JSON lines, filters,
//! `--follow`) and `audit verify` its hash chain. Exit status: 0 fine, 1 the
//! chain is broken, 2 the log cannot be read or the arguments are wrong.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Config;
use crate::disk::audit::Action;
use crate::disk::audit::{each_line, parse_time_bound, verify_files, Filter, Follower, Line, Record};
use clap::{Args, Subcommand};

const EXIT_BROKEN: i32 = 1;
const EXIT_UNREADABLE: i32 = 2;
/// How often `--follow` looks for new lines.
const FOLLOW_POLL: Duration = Duration::from_millis(250);

const EXAMPLES: &str = "\
Examples:
  salt-keysync audit                                  every record, as a table
  salt-keysync audit --minion 'web*' --since 2h       web* minions, last two hours
  salt-keysync audit --action accept,reject --origin master-b
  salt-keysync audit --since 2026-11-21T08:00:00Z --until 2026-11-21T12:00:00Z --json
  salt-keysync audit --follow --action refuse,conflict
  salt-keysync audit --file audit.jsonl-20261101 --file audit.jsonl   rotated files too, oldest first
  salt-keysync audit verify
  salt-keysync audit verify audit.jsonl-20261001 audit.jsonl-20261101 audit.jsonl

Filters combine (all must match); --action and --origin take several values,
comma-separated or repeated. Times are RFC 3339, a date (midnight UTC), or a
duration ago (2h, 30m, 1day). The packaged logrotate names rotated files
audit.jsonl-YYYYMMDD (dateext).

Exit status: 0 success (verify: chain intact), 1 verify found the chain
broken (the first bad record is named), 2 the log cannot be read.";

const VERIFY_EXAMPLES: &str = "\
Examples:
  salt-keysync audit verify                      the config's audit_log
  salt-keysync audit verify --config /etc/salt-keysync/config.toml
  salt-keysync audit verify audit.jsonl-20261101 audit.jsonl    rotated files, oldest first
  salt-keysync audit verify --head SEQ:HASH              the chain must reach this record

Each record holds the sha256 of the line before it (prev) and a sequence
number (seq). verify names the first bad record and why: edited, removed
(a gap in seq) or reordered. A file that continues a rotated one starts with
a `continue` record: alone it verifies with a note; give the older files
first to check the link. A torn last line (crash during a write) is a
warning. Exit status: 0 intact, 1 broken, 2 unreadable.";

#[derive(Args)]
#[command(after_help = EXAMPLES, args_conflicts_with_subcommands = true)]
pub struct AuditArgs {
    #[command(flatten)]
    pub config: crate::cli::ConfigArg,
    #[command(subcommand)]
    command: Option<AuditCommand>,
    /// Read this audit file instead of the config's `audit_log`; repeat for
    /// rotated files, oldest first (--follow follows the last).
    #[arg(long, value_name = "PATH")]
    file: Vec<PathBuf>,
    /// Print the matching records as they are in the log, one JSON object per line
    /// (an error as {"error": "..."}).
    #[arg(long)]
    json: bool,
    /// Only records for minion ids matching this glob (`web*`, `db-[0-9]?`).
    #[arg(long, value_name = "GLOB")]
    minion: Option<String>,
    /// Only these actions (accept, reject, delete, pending, conflict, refuse, connect, ...;
    /// an unknown one is an error that lists them all).
    #[arg(long, value_name = "ACTION", value_delimiter = ',')]
    action: Vec<String>,
    /// Only decisions made on these nodes.
    #[arg(long, value_name = "NODE", value_delimiter = ',')]
    origin: Vec<String>,
    /// Only records at or after TIME (RFC 3339, a date, or a duration ago: 2h, 30m).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Only records at or before TIME (same forms as --since).
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
    /// Keep printing records as they are appended (follows log rotation).
    #[arg(short, long)]
    follow: bool,
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Check the hash chain and name the first bad record.
    #[command(after_help = VERIFY_EXAMPLES)]
    Verify {
        /// Audit files in chain order, oldest first (default: the config's audit_log).
        files: Vec<PathBuf>,
        /// The chain must reach this record: `SEQ:HASH`, as a `gap` record names
        /// it or as noted elsewhere; a log cut before it fails (records cut off
        /// the end leave a chain that is intact otherwise).
        #[arg(long, value_name = "SEQ:HASH")]
        head: Option<crate::disk::audit::AuditHead>,
    },
}

/// Runs `audit`; returns the exit status.
pub fn audit(config: &Path, args: &AuditArgs) -> i32 {
    match run(config, args) {
        Ok(code) => code,
        // With --json, the error is JSON on stdout as well.
        Err(e) if args.json => {
            crate::say!("{}", serde_json::json!({ "error": crate::text::error_chain(e.as_ref()) }));
            EXIT_UNREADABLE
        }
        Err(e) => {
            eprintln!("salt-keysync: {}", crate::text::error_chain(e.as_ref()));
            EXIT_UNREADABLE
        }
    }
}

fn run(config: &Path, args: &AuditArgs) -> anyhow::Result<i32> {
    let loaded = Config::load(config);
    let configured = || -> anyhow::Result<PathBuf> {
        match &loaded {
            Ok(config) => Ok(config.audit_log.clone()),
            Err(e) => Err(anyhow::anyhow!("{e}")),
        }
    };
    match &args.command {
        Some(AuditCommand::Verify { files, head }) => {
            let files = if files.is_empty() { vec![configured()?] } else { files.clone() };
            let code = verify(&files)?;
            match head {
                Some(head) if code == 0 => reaches(&files, head),
                _ => Ok(code),
            }
        }
        None => {
            let paths = if args.file.is_empty() { vec![configured()?] } else { args.file.clone() };
            let filter = filter(args)?;
            known_origins(&args.origin, loaded.as_ref().ok(), &paths)?;
            let mut out = Output::new(args.json);
            for (idx, path) in paths.iter().enumerate() {
                let follow = args.follow && idx + 1 == paths.len();
                match list(path, &filter, &mut out, follow) {
                    Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(0),
                    Err(e) => anyhow::bail!("cannot read audit log {}: {e}", path.display()),
                    Ok(()) => {}
                }
            }
            Ok(0)
        }
    }
}

fn filter(args: &AuditArgs) -> anyhow::Result<Filter> {
    let now = time::OffsetDateTime::now_utc();
    let bound = |flag: &str, text: &Option<String>| -> anyhow::Result<_> {
        text.as_deref().map(|t| parse_time_bound(t, now)).transpose().map_err(|e| anyhow::anyhow!("{flag}: {e}"))
    };
    let minion = match &args.minion {
        Some(glob) => {
            check_minion_glob(glob)?;
            Some(glob::Pattern::new(glob).map_err(|e| anyhow::anyhow!("--minion: {glob:?} is not a glob: {e}"))?)
        }
        None => None,
    };
    // A misspelt value would match nothing and look like an empty log.
    for action in &args.action {
        if !Action::ALL.iter().any(|known| known.as_str() == action) {
            let all: Vec<&str> = Action::ALL.iter().map(|a| a.as_str()).collect();
            anyhow::bail!("--action: {action:?} is not an audit action (one of {})", all.join(", "));
        }
    }
    for origin in &args.origin {
        crate::config::check_name(origin).map_err(|e| anyhow::anyhow!("--origin: {e} (origins are node names)"))?;
    }
    Ok(Filter {
        minion,
        actions: args.action.clone(),
        origins: args.origin.clone(),
        since: bound("--since", &args.since)?,
        until: bound("--until", &args.until)?,
    })
}

/// An `--origin` that can match nothing is a mistake, not an empty answer:
/// each must name a master of the site as the config lists them (this node,
/// its `[[peer]]`s, `retired_masters`), or be the origin of a record in
/// `paths` (a master that left before `retired_masters` named it, or a log
/// read without its config).
fn known_origins(origins: &[String], config: Option<&Config>, paths: &[PathBuf]) -> anyhow::Result<()> {
    let masters: Vec<&str> = config
        .map(|c| {
            let peers = c.peers.iter().map(|p| p.name.as_str());
            std::iter::once(c.node.as_str()).chain(peers).chain(c.retired_masters.iter().map(String::as_str)).collect()
        })
        .unwrap_or_default();
    let mut unknown: Vec<&str> = origins.iter().map(String::as_str).filter(|o| !masters.contains(o)).collect();
    for path in paths {
        if unknown.is_empty() {
            break;
        }
        // An unreadable file is the listing's error to tell.
        let Ok(file) = std::fs::File::open(path) else { continue };
        each_line(io::BufReader::new(file), 1, |line| {
            if let Some(origin) = line.record.ok().and_then(|record| record.origin) {
                unknown.retain(|name| *name != origin);
            }
        })?;
    }
    let Some(name) = unknown.first() else { return Ok(()) };
    let files: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let site = match config {
        Some(_) => format!("is no master of this site ({})", masters.join(", ")),
        None => "names no master of a config (none could be read)".to_string(),
    };
    anyhow::bail!("--origin: {name:?} {site}, and no record in {} names it as its origin", files.join(", "))
}

/// A glob that no minion id can match is a mistake, not an empty answer:
/// Salt's ids never hold '/', '\\' or NUL, and this agent's never start
/// with a dot.
fn check_minion_glob(glob: &str) -> anyhow::Result<()> {
    if glob.contains(['/', '\\', '\0']) {
        anyhow::bail!("--minion: {glob:?} can never match a minion id (ids contain no '/', '\\' or NUL)");
    }
    if glob.starts_with('.') {
        anyhow::bail!("--minion: {glob:?} can never match a minion id (ids do not start with a dot)");
    }
    Ok(())
}

fn verify(files: &[PathBuf]) -> anyhow::Result<i32> {
    let report = verify_files(files)?;
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    for note in &report.notes {
        crate::say!("note: {note}");
    }
    for warning in &report.warnings {
        eprintln!("warning: {warning}");
    }
    match report.broken {
        None => {
            crate::say!("ok: {} records in {}, chain intact", report.n_records, names.join(", "));
            Ok(0)
        }
        Some(bad) => {
            crate::say!("BROKEN: {} line {}: {}", bad.file.display(), bad.line, bad.why);
            Ok(EXIT_BROKEN)
        }
    }
}

/// Whether the chain in `files` holds the record `head` names (its seq, with
/// exactly that line): a log cut before it, or replaced at it, fails.
fn reaches(files: &[PathBuf], head: &crate::disk::audit::AuditHead) -> anyhow::Result<i32> {
    let mut found: Option<String> = None;
    let mut last = 0;
    for path in files {
        let file = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        each_line(io::BufReader::new(file), 1, |line| {
            if let Ok(record) = &line.record {
                last = last.max(record.seq);
                if record.seq == head.seq {
                    found = Some(line.hash.clone());
                }
            }
        })?;
    }
    match found {
        Some(hash) if hash == head.hash => {
            crate::say!("ok: the chain reaches record {head}");
            Ok(0)
        }
        Some(hash) => {
            crate::say!("BROKEN: record {} is {}:{hash}, not {head}: replaced", head.seq, head.seq);
            Ok(EXIT_BROKEN)
        }
        None if last < head.seq => {
            crate::say!("BROKEN: the chain ends at record {last}, before {head}: records were cut off the end");
            Ok(EXIT_BROKEN)
        }
        None => {
            crate::say!("BROKEN: record {} is not in these files (give the rotated files that hold it)", head.seq);
            Ok(EXIT_BROKEN)
        }
    }
}

/// Prints the records of `path` that match; with `follow`, then waits for more.
fn list(path: &Path, filter: &Filter, out: &mut Output, follow: bool) -> io::Result<()> {
    if !follow {
        let file = std::fs::File::open(path)?;
        let mut rows = Vec::new();
        let torn = each_line(io::BufReader::new(file), 1, |line| {
            if let Some(record) = keep(path, line, filter) {
                rows.push(record);
            }
        })?;
        if let Some(torn) = torn {
            eprintln!("warning: {}", torn.warning(path));
        }
        return out.print(&rows);
    }
    let mut follower = Follower::new(path);
    loop {
        let polled = follower.poll()?;
        if let Some(how) = polled.rotated {
            eprintln!("note: {} was {how} (log rotation); following the new file", path.display());
        }
        let rows: Vec<(String, Record)> = polled.lines.into_iter().filter_map(|l| keep(path, l, filter)).collect();
        out.print(&rows)?;
        std::thread::sleep(FOLLOW_POLL);
    }
}

/// The line and its record when it matches; warns about lines that are not records.
fn keep(path: &Path, line: Line, filter: &Filter) -> Option<(String, Record)> {
    match line.record {
        Ok(record) => filter.matches(&record).then_some((line.raw, record)),
        Err(why) => {
            eprintln!("warning: {} line {}: {why}; skipped", path.display(), line.number);
            None
        }
    }
}

/// Table or JSON lines on stdout.
struct Output {
    json: bool,
    header_done: bool,
}

const HEADERS: [&str; 9] = ["TIME", "NODE", "ACTION", "OUTCOME", "MINION", "ORIGIN", "VIA", "FINGERPRINT", "DETAIL"];
/// Minimum widths, so `--follow` batches line up in the common case.
const MIN_WIDTHS: [usize; 9] = [20, 8, 8, 10, 16, 8, 8, 23, 0];

impl Output {
    fn new(json: bool) -> Output {
        Output { json, header_done: false }
    }

    fn print(&mut self, rows: &[(String, Record)]) -> io::Result<()> {
        let stdout = io::stdout();
        let mut w = stdout.lock();
        if self.json {
            for (raw, _) in rows {
                writeln!(w, "{raw}")?;
            }
            return w.flush();
        }
        if rows.is_empty() {
            return Ok(());
        }
        w.write_all(self.table(rows).as_bytes())?;
        w.flush()
    }

    /// `rows` as a table: with its header the first time, the rows alone
    /// for each later batch of `--follow`.
    fn table(&mut self, rows: &[(String, Record)]) -> String {
        let mut table = crate::cli::table::Table::new(HEADERS).min_widths(&MIN_WIDTHS);
        for (_, record) in rows {
            table.row(cells(record));
        }
        let text = if self.header_done { table.render_rows() } else { table.render() };
        self.header_done = true;
        text
    }
}

fn cells(r: &Record) -> [String; 9] {
    let time = time::OffsetDateTime::parse(&r.time, &time::format_description::well_known::Rfc3339)
        .ok()
        .and_then(|t| {
            t.format(time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]Z")).ok()
        })
        .unwrap_or_else(|| r.time.clone());
    let mut detail: Vec<String> = Vec::new();
    if let Some(reason) = &r.reason {
        detail.push(reason.clone());
    }
    if let Some(other) = &r.other_fingerprint {
        detail.push(format!("other key {}", short_fingerprint(other)));
    }
    if let Some(peer) = &r.peer {
        detail.push(format!("peer {peer}"));
    }
    if let Some(remote) = &r.remote {
        detail.push(format!("from {remote}"));
    }
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    // Every cell: ids, names and reasons are others' text (the table shows them safely).
    [
        time,
        r.node.clone(),
        r.action.clone(),
        r.outcome.clone(),
        dash(&r.minion),
        dash(&r.origin),
        r.via.clone(),
        r.fingerprint.as_deref().map_or_else(|| "-".into(), short_fingerprint),
        detail.join("; "),
    ]
}

/// The first eight bytes of a colon-hex fingerprint, enough to tell keys apart
/// in a table (`--json` has the whole).
fn short_fingerprint(fp: &str) -> String {
    if fp.chars().count() > 23 {
        format!("{}…", fp.chars().take(23).collect::<String>())
    } else {
        fp.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(json: &str) -> (String, Record) {
        (json.to_string(), serde_json::from_str(json).unwrap())
    }

    /// Issue 30: the audit table counts characters: an id, a node or a
    /// reason in another script (others' text) and the "…" of a cut
    /// fingerprint keep every column under its header, in a `--follow`
    /// batch printed under the first one too.
    #[test]
    fn columns_line_up_whatever_the_ids_and_reasons() {
        let fp = "3f:a1:00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd";
        let mut output = Output::new(false);
        let first = output.table(&[
            record(&format!(
                r#"{{"time":"2026-11-21T12:00:00Z","node":"mästér-a","action":"refuse","minion":"wéb01","fingerprint":"{fp}","origin":"master-b","via":"master-b","outcome":"refused","reason":"clé refusée"}}"#
            )),
            record(
                r#"{"time":"2026-11-21T12:00:01Z","node":"master-a","action":"accept","minion":"ウェブ02","via":"local","outcome":"applied"}"#,
            ),
        ]);
        let later = output.table(&[record(
            r#"{"time":"2026-11-21T12:00:02Z","node":"master-a","action":"delete","minion":"db01","origin":"マスター-c","via":"master-c","outcome":"applied"}"#,
        )]);
        let column_of = |line: &str, cell: &str| {
            line[..line.find(cell).unwrap_or_else(|| panic!("{cell:?} not in {line:?}"))].chars().count()
        };
        let lines: Vec<&str> = first.lines().chain(later.lines()).collect();
        assert_eq!(lines.len(), 4, "the header once, then the rows of both batches:\n{first}{later}");
        let header = lines[0];
        assert!(header.starts_with("TIME                  NODE      ACTION"), "{header}");
        for (row, cells) in lines[1..].iter().zip([
            ["mästér-a", "refuse", "refused", "wéb01", "master-b", "3f:a1:00:11:22:33:44:55…", "clé refusée"],
            ["master-a", "accept", "applied", "ウェブ02", "-", "-", ""],
            ["master-a", "delete", "applied", "db01", "マスター-c", "-", ""],
        ]) {
            let columns = ["NODE", "ACTION", "OUTCOME", "MINION", "ORIGIN", "FINGERPRINT", "DETAIL"];
            for (cell, column) in cells.iter().zip(columns).filter(|(cell, _)| !["-", ""].contains(cell)) {
                assert_eq!(column_of(row, cell), column_of(header, column), "{cell:?} under {column}:\n{first}{later}");
            }
        }
    }
}
