//! The command line: each subcommand, its arguments and its help.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use salt_keysync::cli::{audit_cmd, certs, demo, generate, ConfigArg};

#[derive(Parser)]
#[command(
    name = "salt-keysync",
    version = salt_keysync::version_line(),
    about = "Replicates salt-key decisions between SaltStack masters"
)]
pub(crate) struct Cli {
    /// The config file of the subcommand (its `--config`: only the
    /// subcommands that read the config have one), set after parsing.
    #[arg(skip)]
    pub(crate) config: PathBuf,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run the agent in the foreground (for systemd); SIGHUP reloads peers and certificates.
    #[command(
        long_about = "Run the agent in the foreground: watch the master's key folders, replicate \
                      accept/reject/delete decisions to the peers and apply theirs. Logs go to \
                      stderr (journald under systemd); SIGTERM or SIGINT stops it cleanly, SIGHUP \
                      reloads peers and certificates.",
        after_help = RUN_EXAMPLES
    )]
    Run(RunArgs),
    /// Validate the config, certificates and the salt-master set-up without starting.
    #[command(
        long_about = "Validate a set-up without starting the agent: the config file, the TLS \
                      certificates (chain, node name, expiry), the three key folders, the salt \
                      user, that the master uses the local key store, and that the state is not \
                      lost; then probes every peer at once, within 3 s each (name, TCP, TLS both \
                      ways, the peer's answer). Run by root, it checks as the agent's user (the owner \
                      of state_dir, as the packaged unit runs it). Prints one line per check; exits 1 \
                      if any failed. A peer that is down or refuses this master is a WARN line, not a \
                      failure: the agent starts anyway and retries it.",
        after_help = CHECK_EXAMPLES
    )]
    Check(ConfigArg),
    /// Ask the running agent to re-read peers and certificates, and wait for the outcome.
    #[command(
        long_about = "Ask the running agent, over its control socket, to re-read its config as SIGHUP \
                      does: [[peer]] and [tls] (files included) apply at once; a config that does not \
                      load, or that changes any other key, is refused and the running config stays in \
                      force. Prints what changed; exits 1 with the reason when the reload is refused or \
                      the agent is not running. The packaged unit's ExecReload.",
        after_help = "Examples:\n  salt-keysync reload\n  systemctl reload salt-keysync          # runs it"
    )]
    Reload(ConfigArg),
    /// Make a CA (`certs init`) and node certificates (`certs issue NAME`) for sites without a PKI.
    Certs(certs::CertsArgs),
    /// Ask the running agent about its peers, keys and cluster health.
    #[command(
        long_about = "Ask the running agent, over its local control socket (control_socket, default \
<state_dir>/control.sock, owner-only), about every peer: link state (up / down / connecting) and \
last error, last contact, what the peer lacks from this master and this master from it (counts \
from the last anti-entropy digest comparison), key counts per state, the last anti-entropy round, \
and whether the peer's master.pub, must-agree master settings (external_auth, publisher_acl, \
peer, peer_run, nodegroups) and key-acceptance settings match this master's, and every master's \
Salt version and salt-keysync version (this agent's with its protocol). A master that accepts keys \
by itself (auto_accept, open_mode, an autosign file or grains folder) is an error on every master; \
agents of different versions are a warning until the upgrade ends. Deletes a blast-radius guard \
holds are an error on every master (here, as the peers holding this master's deletes say, and as \
each peer says what it holds); decisions a peer sent that were refused in the last hour are a \
warning (those made in the future apart). --cluster shows one row per master.\n\n\
Exit status: 0 when the agent answered and no finding is an error (warnings may be present); 1 when \
the agent could not be asked (not running, no access to its socket, the config unreadable), with a \
one-line message; 3 when the agent answered and a finding is an error (the report is printed whole); \
2, as for every command, for wrong arguments.",
        after_help = "Examples:\n  salt-keysync status\n  salt-keysync status --cluster\n  salt-keysync status --cluster --json | jq '.findings[] | select(.level == \"error\")'\n  salt-keysync status --config /etc/salt-keysync/config.toml --json | jq '.peers[] | select(.state != \"up\")'\n  salt-keysync status >/dev/null; echo $?   # 0 fine, 1 not asked, 3 an error finding"
    )]
    Status(StatusArgs),
    /// Show what first contact does on every master: per id, what each holds and will show.
    #[command(
        long_about = "Ask the running agent what first contact does on every master: for each id whose \
state differs between masters, what each master holds and what it will show once the agents run in \
normal mode, and why (the rules are in docs/adopting.md). Meant for agents in observe mode \
(mode = \"observe\" or `run --observe`), which write nothing; in normal mode it lists the conflicts no \
rule settles. The agent asks its peers over their mutual-TLS link.",
        after_help = "Examples:\n  salt-keysync plan\n  salt-keysync plan --json | jq '.masters[] | {node, n: (.rows | length)}'"
    )]
    Plan(PlanArgs),
    /// List the peers' deletes this master's blast-radius guard holds.
    #[command(
        long_about = "List, from the running agent, the peers' deletes of accepted keys that its \
blast-radius guard holds: a burst of deletes from one master that came faster than [guard] lets \
through (salt-key -D, a script, manage.key_regen). They are not applied here until an operator \
releases them (`salt-keysync release`) or reverts them (`salt-keysync revert`); a newer decision \
about an id (salt-key -a on any master) settles it too. Rejections are never held.",
        after_help = "Examples:\n  salt-keysync held\n  salt-keysync held --json | jq -r '.held[].minion'"
    )]
    Held(HeldArgs),
    /// Apply held deletes on every master (the guard lets them through everywhere).
    #[command(
        long_about = "Release deletes this master's guard holds: each becomes a new delete from this \
master that knew the held one, applied here (its key file removed, .dfn dropped so the master \
rotates its AES key) and sent to every peer, whose guard lets it through. Without --origin or ids, \
everything held here. It shows what it will do and asks, as salt-key -d does (Proceed? [N/y], no \
by default); -y does not ask, --dry-run only shows; without a terminal to ask on and without -y \
it does nothing and exits 1. Audited as `release`, naming the user who ran it.",
        after_help = "Examples:\n  salt-keysync release --origin master-a\n  salt-keysync release --dry-run\n  salt-keysync release -y web01 web02"
    )]
    Release(OperatorArgs),
    /// Undo held deletes: accept the keys again everywhere, the master they were deleted on included.
    #[command(
        long_about = "Revert deletes this master's guard holds: each becomes a new accept, from this \
master, of the key it still holds, which wins on every master — the master where the delete was \
made writes the key back (a pending copy of the same key is moved into place). Without --origin or \
ids, everything held here. It shows what it will do and asks, as salt-key -a does (Proceed? [n/Y], \
yes by default); -y does not ask, --dry-run only shows; without a terminal to ask on and without \
-y it does nothing and exits 1. Audited as `revert`, naming the user who ran it.",
        after_help = "Examples:\n  salt-keysync revert --origin master-a\n  salt-keysync revert --dry-run --origin master-a\n  salt-keysync revert -y web01"
    )]
    Revert(OperatorArgs),
    /// Start three agents on 127.0.0.1 in a temporary folder and watch accept, reject and delete propagate.
    Demo(demo::DemoArgs),
    /// Review the audit log (table, --json, filters, --follow) or verify its hash chain.
    Audit(audit_cmd::AuditArgs),
    /// Rebuild a lost or corrupt state folder from the peers (the agent must be stopped).
    #[command(after_help = RECOVER_EXAMPLES)]
    Recover(RecoverArgs),
    /// Join the site again as a new master after more than tombstone_ttl out of contact (the agent must be stopped).
    #[command(after_help = REJOIN_EXAMPLES)]
    Rejoin(RejoinArgs),
    /// Write man pages or shell completions (used to build the packages).
    #[command(hide = true, after_help = GENERATE_EXAMPLES)]
    Generate(generate::GenerateArgs),
    /// Hand the agent's files that root left in its folders to the agent's user (run by the packages, as root).
    #[command(hide = true)]
    HandOver(HandOverArgs),
}

impl Command {
    /// The `--config` of the subcommands that read the config file.
    pub(crate) fn config_file(&self) -> Option<&std::path::Path> {
        let arg = match self {
            Command::Run(args) => &args.config,
            Command::Check(arg) | Command::Reload(arg) => arg,
            Command::Status(args) => &args.config,
            Command::Plan(args) => &args.config,
            Command::Audit(args) => &args.config,
            Command::Recover(args) => &args.config,
            Command::Rejoin(args) => &args.config,
            Command::Held(args) => &args.config,
            Command::Release(args) | Command::Revert(args) => &args.config,
            Command::HandOver(args) => &args.config,
            Command::Certs(_) | Command::Demo(_) | Command::Generate(_) => return None,
        };
        Some(&arg.config)
    }
}

const RECOVER_EXAMPLES: &str = "\
The agent refuses to start when its state folder is gone or unreadable but the
key folders were already synced (pki_dir/.keysync-staging/.salt-keysync-state names the state
store). This fetches every decision the reachable peers hold, moves the old
store aside, and leaves the decisions for the next start to apply; the files on
this master are then treated like a first start and never override the peers.

Examples:
  systemctl stop salt-keysync
  salt-keysync recover --from-peers --config /etc/salt-keysync/config.toml
  systemctl start salt-keysync

  # state restored from an old backup (it looks healthy, but is stale):
  salt-keysync recover --from-peers --force

See /usr/share/doc/salt-keysync/recovery.md for every recovery case.";

const REJOIN_EXAMPLES: &str = "\
A master out of contact with every peer for longer than tombstone_ttl (a
standby powered off for months) offers nothing: its peers have forgotten the
deletes it missed, and its old keys would come back everywhere. `status` says
so, and `salt-keysync plan` lists the keys this command sets aside: the state
store and every accepted or rejected key file are moved into
<state_dir>/rejoin-<time>/ (pending keys stay). The next start is a first
start on folders that decide nothing: the agent fetches the site's state from
its peers; keys only this master held come back as pending when their minions
reconnect.

Examples:
  salt-keysync plan
  systemctl stop salt-keysync
  salt-keysync rejoin
  systemctl start salt-keysync

See /usr/share/doc/salt-keysync/operations.md, \"Deletes are remembered for tombstone_ttl\".";

#[derive(clap::Args)]
pub(crate) struct RejoinArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// Do it without asking.
    #[arg(short = 'y', long)]
    pub(crate) yes: bool,
    /// Show what would be set aside, and change nothing.
    #[arg(long, conflicts_with = "yes")]
    pub(crate) dry_run: bool,
    /// Also when this master is not stale (its last contact is within tombstone_ttl).
    #[arg(long)]
    pub(crate) force: bool,
}

/// `salt-keysync hand-over`: what `/usr/lib/salt-keysync/owners` runs as root
/// (see `disk/handover.rs`).
#[derive(clap::Args)]
pub(crate) struct HandOverArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// The agent's user, as /etc/passwd names it.
    #[arg(long, value_name = "NAME")]
    pub(crate) user: String,
}

#[derive(clap::Args)]
pub(crate) struct RecoverArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// Rebuild from the configured peers (the only source there is; required).
    #[arg(long, required = true)]
    pub(crate) from_peers: bool,
    /// Rebuild even when the current state looks healthy (e.g. restored from a backup).
    #[arg(long)]
    pub(crate) force: bool,
}

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// Observe mode: connect, exchange and report (`salt-keysync plan`), but
    /// write nothing to the key folders and keep no state (as `mode = "observe"`).
    #[arg(long)]
    pub(crate) observe: bool,
}

#[derive(clap::Args)]
pub(crate) struct PlanArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// Print every master's rows as one JSON object (an error as {"error": "..."}).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(clap::Args)]
pub(crate) struct HeldArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// Print the list as one JSON object (an error as {"error": "..."}).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(clap::Args)]
pub(crate) struct OperatorArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// Only the deletes made on this master.
    #[arg(long, value_name = "NAME")]
    pub(crate) origin: Option<String>,
    /// Only these minion ids.
    #[arg(value_name = "ID")]
    pub(crate) ids: Vec<String>,
    /// Print the outcome as one JSON object (an error as {"error": "..."}); the
    /// plan and the question, if asked, go to stderr.
    #[arg(long)]
    pub(crate) json: bool,
    /// Do it without asking.
    #[arg(short = 'y', long)]
    pub(crate) yes: bool,
    /// Show what it would do (with --json, as one JSON object), and change nothing.
    #[arg(long, conflicts_with = "yes")]
    pub(crate) dry_run: bool,
}

#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// Print the whole report as one JSON object (an error as {"error": "..."}).
    #[arg(long)]
    pub(crate) json: bool,
    /// One row per master of the site as this agent knows it (link, last contact, key counts, Salt and agent versions, findings).
    #[arg(long)]
    pub(crate) cluster: bool,
}

const RUN_EXAMPLES: &str = "\
Examples:
  salt-keysync run                                  # /etc/salt-keysync/config.toml
  salt-keysync run --config ./config.toml
  SALT_KEYSYNC_LOG=debug salt-keysync run           # more detail
  systemctl start salt-keysync                      # as packaged
  salt-keysync reload                               # or: systemctl reload salt-keysync, kill -HUP

On SIGHUP (or `salt-keysync reload`) the config is read again: [[peer]]
and [tls] (files included) apply at once, without dropping unchanged
links; a config that does not load, or that changes any other key, is
refused with the reason in the log and the audit log, and the running
config stays in force. A start refused before the agent is ready (config,
certificates, permissions, a lost state) exits with status 78. A listen
address another program holds is tried again for 15 s, then exits with
status 75, a temporary failure the packaged unit restarts.
Under systemd (Type=notify) it reports READY=1, RELOADING=1, STOPPING=1 and
pings the watchdog when WatchdogSec= is set.";

const CHECK_EXAMPLES: &str = "Examples:
  salt-keysync check
  salt-keysync check --config /etc/salt-keysync/config.toml && systemctl restart salt-keysync";

const GENERATE_EXAMPLES: &str = "Examples:
  salt-keysync generate man target/man
  salt-keysync generate completions bash target/completions";
