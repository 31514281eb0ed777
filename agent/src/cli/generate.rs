//! `salt-keysync generate` (hidden): writes the man pages and shell
//! completions that the .deb and .rpm ship. Both are rendered from the clap
//! definition the binary itself parses, passed in at run time, so every
//! subcommand anyone adds shows up without a list kept by hand.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap_complete::Shell;

#[derive(clap::Args)]
pub struct GenerateArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Man pages: salt-keysync.1 and one salt-keysync-SUBCOMMAND.1 per subcommand.
    Man {
        /// Folder to write the pages into (created if missing).
        dir: PathBuf,
    },
    /// A completion script for SHELL, named as that shell expects.
    Completions {
        shell: Shell,
        /// Folder to write the script into (created if missing).
        dir: PathBuf,
    },
}

/// Renders what `args` asks for from `cli`, the binary's own command.
pub fn generate(args: &GenerateArgs, cli: clap::Command) -> Result<()> {
    match &args.what {
        What::Man { dir } => {
            create_dir(dir)?;
            let mut cli = cli.disable_help_subcommand(true);
            cli.build();
            let siblings: Vec<String> = cli
                .get_subcommands()
                .filter(|sub| !sub.is_hide_set())
                .map(|sub| format!("{BIN_NAME}-{}", sub.get_name()))
                .collect();
            man_pages(cli, dir, &siblings).with_context(|| format!("cannot write man pages into {}", dir.display()))?;
            crate::say!("wrote man pages into {}", dir.display());
        }
        What::Completions { shell, dir } => {
            create_dir(dir)?;
            let mut cli = without_hidden_subcommands(cli);
            let name = cli.get_name().to_string();
            let path = clap_complete::generate_to(*shell, &mut cli, name, dir)
                .with_context(|| format!("cannot write {shell} completions into {}", dir.display()))?;
            crate::say!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// One page for `cmd` and one for each visible subcommand below it (hidden
/// ones, this one, get none), as clap_mangen's `generate_to` makes them,
/// with the sections it lacks: EXAMPLES (the `after_help` text, as written:
/// not reflowed), FILES, EXIT STATUS and SEE ALSO.
fn man_pages(cmd: clap::Command, dir: &Path, siblings: &[String]) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|sub| !sub.is_hide_set()).cloned() {
        man_pages(sub, dir, siblings)?;
    }
    let examples = cmd.get_after_long_help().or_else(|| cmd.get_after_help()).map(|text| text.to_string());
    let has_args = cmd.get_arguments().any(|arg| !arg.is_hide_set());
    let has_subcommands = cmd.get_subcommands().any(|sub| !sub.is_hide_set());
    let has_version = cmd.get_version().is_some();
    let man = clap_mangen::Man::new(cmd);
    let name = man.get_filename();
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    if has_args {
        man.render_options_section(&mut page)?;
    }
    if has_subcommands {
        man.render_subcommands_section(&mut page)?;
    }
    let title = name.trim_end_matches(".1");
    let examples = examples.unwrap_or_else(|| match title.strip_prefix(BIN_NAME) {
        Some("") => TOP_EXAMPLES.to_string(),
        words => format!("Example:\n  {BIN_NAME}{} --help", words.unwrap_or_default().replace('-', " ")),
    });
    page.extend_from_slice(b".SH EXAMPLES\n.nf\n");
    for line in examples.lines() {
        page.extend_from_slice(verbatim(line).as_bytes());
        page.push(b'\n');
    }
    page.extend_from_slice(b".fi\n");
    page.extend_from_slice(FILES.as_bytes());
    page.extend_from_slice(EXIT_STATUS.as_bytes());
    let mut see_also: Vec<String> = std::iter::once(BIN_NAME.to_string())
        .chain(siblings.iter().cloned())
        .filter(|page| page != title)
        .map(|page| format!("\\fB{}\\fR(1)", escape(&page)))
        .collect();
    see_also.extend(
        ["\\fBsalt\\-key\\fR(1)", "\\fBsalt\\-master\\fR(1)", "\\fBsystemctl\\fR(1)", "\\fBlogrotate\\fR(8)"]
            .map(String::from),
    );
    page.extend_from_slice(format!(".SH \"SEE ALSO\"\n{}\n.PP\n{}\n", see_also.join(", "), escape(DOCS)).as_bytes());
    if has_version {
        man.render_version_section(&mut page)?;
    }
    fs::write(dir.join(&name), page)
}

/// The main page's examples: a day with the agent.
const TOP_EXAMPLES: &str = "\
Examples:
  salt-keysync check                     # validate the set-up, probe every peer
  systemctl enable --now salt-keysync    # runs `salt-keysync run` under systemd
  salt-keysync status                    # peers, keys and cluster health
  salt-keysync audit --since 1d          # what was decided, where, and by whom";

/// Where the packages put things, as `run` uses them by default.
const FILES: &str = r".SH FILES
.TP
\fI/etc/salt\-keysync/config.toml\fR
The config (\fB\-\-config\fR). Mode 0640 or stricter; it names the peers and the CA.
.TP
\fI/etc/salt\-keysync/tls/\fR
ca.pem, node.pem and node.key (0600) as the packaged config names them (\fB[tls]\fR).
.TP
\fI/var/lib/salt\-keysync/\fR
state_dir: state.redb, the agent's store of decisions, and control.sock, the control socket
that \fBstatus\fR, \fBreload\fR and \fBplan\fR ask (\fBcontrol_socket\fR).
.TP
\fI/var/log/salt\-keysync/audit.jsonl\fR
The hash\-chained audit log (\fBaudit_log\fR as packaged; default state_dir/audit.jsonl);
rotated by \fI/etc/logrotate.d/salt\-keysync\fR as audit.jsonl\-YYYYMMDD.
.TP
\fI/etc/salt/pki/master/.keysync\-staging/\fR
The agent's staging folder in pki_dir, and .salt\-keysync\-state, the marker naming the store
that synced the key folders.
.TP
\fI/usr/share/doc/salt\-keysync/\fR
README.md, operations.md, recovery.md, monitoring.md and SECURITY.md.
";

/// The exit statuses `main.rs` and `audit` use.
const EXIT_STATUS: &str = r#".SH "EXIT STATUS"
.TP
\fB0\fR
Success (\fBcheck\fR: every check passed; a peer that cannot be reached is a warning).
.TP
\fB1\fR
Failure, with its cause on one line (with \fB\-\-json\fR: {"error": ...} on stdout):
\fBcheck\fR found a problem, the agent is not running, a reload was refused,
\fBaudit verify\fR found the chain broken, \fBrelease\fR or \fBrevert\fR had no terminal to ask on
and no \fB\-y\fR.
.TP
\fB2\fR
Wrong arguments; \fBaudit\fR: the log cannot be read or a filter value is invalid.
.TP
\fB3\fR
\fBstatus\fR: the agent answered and a finding is an error (an auto\-accepting master, held deletes,
writes failing, ...); the report is printed whole.
.TP
\fB75\fR
\fBrun\fR: a listen address (\fBlisten\fR, \fBmetrics_listen\fR) was still in use by another program after
15 s of retries (EX_TEMPFAIL); the packaged unit starts the agent again.
.TP
\fB78\fR
\fBrun\fR: the start was refused before the agent was ready (config, certificates,
permissions, a lost state: EX_CONFIG); the packaged unit does not restart it.
"#;

const DOCS: &str = "/usr/share/doc/salt-keysync/operations.md (install, certificates, adding and removing a \
                    master, upgrades), /usr/share/doc/salt-keysync/recovery.md (a lost or restored state)";

/// A line of text as it is: no filling, no roff request at its start.
fn verbatim(line: &str) -> String {
    let escaped = escape(line);
    if escaped.starts_with(['.', '\'']) {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

/// Backslashes and hyphens as roff prints them literally.
fn escape(text: &str) -> String {
    text.replace('\\', "\\e").replace('-', "\\-")
}

/// The same command without its hidden subcommands: clap_complete would
/// offer them, and clap cannot remove a subcommand, so the top level is
/// rebuilt from what completions use: arguments and the visible subcommands
/// with everything below them. (clap's names are `&'static str`, so the
/// name is this binary's, which is the name `Cli` declares.)
/// The binary's name, as `Cli` in args.rs declares it.
const BIN_NAME: &str = "salt-keysync";

fn without_hidden_subcommands(cli: clap::Command) -> clap::Command {
    debug_assert_eq!(cli.get_name(), BIN_NAME);
    let mut visible = clap::Command::new(BIN_NAME)
        .args(cli.get_arguments().cloned())
        .subcommands(cli.get_subcommands().filter(|sub| !sub.is_hide_set()).cloned());
    if let Some(about) = cli.get_about() {
        visible = visible.about(about.clone());
    }
    visible
}

fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}
