//! The `salt-keysync` command: `run` the agent, `check` a set-up, make
//! `certs` for sites without a PKI, review the `audit` log, ask the running
//! agent for its `status`, `recover` a lost state folder, watch a `demo` cluster.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use salt_keysync::cli::{audit_cmd, certs, check, demo, emit, generate, ConfigArg};
use salt_keysync::config::{Config, LogFormat, DEFAULT_CONFIG};
use salt_keysync::ops::logging;
use salt_keysync::say;
use tokio_util::sync::CancellationToken;

/// mimalloc instead of glibc malloc: glibc keeps the memory of a large batch
/// (a join of 100,000 keys) in its per-thread arenas long after it is freed;
/// mimalloc hands it back to the system (see [`collect_freed_memory`]).
/// The `system-allocator` feature keeps glibc's, for heap profilers that
/// hook malloc (`heaptrack`), whose figures are then glibc's.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// At most this often a runtime worker going idle returns freed memory.
const COLLECT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Called when a runtime worker goes idle: memory one thread allocated and
/// another freed (a batch decoded on one worker, applied on the other) is
/// only reclaimed by mimalloc when the allocating thread collects, and an
/// idle thread never would. Throttled, so a busy agent pays for it at most
/// once a second per worker.
fn collect_freed_memory() {
    thread_local! {
        static LAST: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
    }
    let now = std::time::Instant::now();
    if LAST.get().is_some_and(|last| now.duration_since(last) < COLLECT_EVERY) {
        return;
    }
    LAST.set(Some(now));
    if !cfg!(feature = "system-allocator") {
        // SAFETY: mi_collect only walks and releases this thread's own
        // mimalloc heap (the global allocator above); it takes no pointers.
        unsafe { libmimalloc_sys::mi_collect(true) }
    }
}

/// Transparent huge pages off for this process. mimalloc asks for them for
/// its arenas, and a 2 MiB page keeps all of itself resident while any
/// allocation in it lives, and is zeroed whole when first touched: an agent
/// holding 100,000 keys sat at 60–65 MiB with them and at 42–48 MiB without
/// (`keysync-bench --join 100000`), and a burst spent a tenth of its time
/// zeroing fresh huge pages. A refusal (a seccomp filter) changes nothing else.
fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes no pointers; it sets a flag of this process.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// mimalloc's `purge_delay` option (`mi_option_purge_delay` in mimalloc.h,
/// the same index in its v2 and v3; libmimalloc-sys names no constant).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Memory freed back to mimalloc's arenas is returned to the system at once,
/// not a second later (v3's default): a join or a first start frees and
/// allocates batches of thousands of keys several times a second, and each
/// batch's memory stayed resident until the next purge, on top of the next
/// batch's. The agents' peaks in a join of 100,000 keys fell from 139–196
/// MiB to 100–146 MiB (`keysync-bench --join 100000`), a first start's by 5
/// MiB, at no cost the benchmark could see (freed pages are decommitted, and
/// faulted in again when reused). `MIMALLOC_PURGE_DELAY` in the environment
/// (mimalloc's own variable, in milliseconds) still sets it instead.
fn purge_freed_memory_at_once() {
    if !cfg!(feature = "system-allocator") && std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets an option; mimalloc reads options at any time.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
    }
}

#[derive(Parser)]
#[command(
    name = "salt-keysync",
    version = salt_keysync::version_line(),
    about = "Replicates salt-key decisions between SaltStack masters"
)]
struct Cli {
    /// The config file of the subcommand (its `--config`: only the
    /// subcommands that read the config have one), set after parsing.
    #[arg(skip)]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    fn config_file(&self) -> Option<&std::path::Path> {
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
struct RejoinArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Do it without asking.
    #[arg(short = 'y', long)]
    yes: bool,
    /// Show what would be set aside, and change nothing.
    #[arg(long, conflicts_with = "yes")]
    dry_run: bool,
    /// Also when this master is not stale (its last contact is within tombstone_ttl).
    #[arg(long)]
    force: bool,
}

/// `salt-keysync hand-over`: what `/usr/lib/salt-keysync/owners` runs as root
/// (see `disk/handover.rs`).
#[derive(clap::Args)]
struct HandOverArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The agent's user, as /etc/passwd names it.
    #[arg(long, value_name = "NAME")]
    user: String,
}

#[derive(clap::Args)]
struct RecoverArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Rebuild from the configured peers (the only source there is; required).
    #[arg(long, required = true)]
    from_peers: bool,
    /// Rebuild even when the current state looks healthy (e.g. restored from a backup).
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Observe mode: connect, exchange and report (`salt-keysync plan`), but
    /// write nothing to the key folders and keep no state (as `mode = "observe"`).
    #[arg(long)]
    observe: bool,
}

#[derive(clap::Args)]
struct PlanArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Print every master's rows as one JSON object (an error as {"error": "..."}).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct HeldArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Print the list as one JSON object (an error as {"error": "..."}).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct OperatorArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Only the deletes made on this master.
    #[arg(long, value_name = "NAME")]
    origin: Option<String>,
    /// Only these minion ids.
    #[arg(value_name = "ID")]
    ids: Vec<String>,
    /// Print the outcome as one JSON object (an error as {"error": "..."}); the
    /// plan and the question, if asked, go to stderr.
    #[arg(long)]
    json: bool,
    /// Do it without asking.
    #[arg(short = 'y', long)]
    yes: bool,
    /// Show what it would do (with --json, as one JSON object), and change nothing.
    #[arg(long, conflicts_with = "yes")]
    dry_run: bool,
}

#[derive(clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Print the whole report as one JSON object (an error as {"error": "..."}).
    #[arg(long)]
    json: bool,
    /// One row per master of the site as this agent knows it (link, last contact, key counts, Salt and agent versions, findings).
    #[arg(long)]
    cluster: bool,
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

fn main() {
    no_transparent_huge_pages();
    purge_freed_memory_at_once();
    let mut cli = Cli::parse();
    cli.config = cli.command.config_file().unwrap_or(std::path::Path::new(DEFAULT_CONFIG)).to_path_buf();
    let result = match cli.command {
        Command::Run(args) => run(&cli.config, &args),
        Command::Plan(args) => json_errors(args.json, plan(&cli.config, &args)),
        // As the agent would find things: run by root, as the agent's user.
        Command::Check(_) => match Config::load(&cli.config) {
            Ok(config) => become_agent_user(&config).and_then(|()| check::check(&cli.config)),
            Err(_) => check::check(&cli.config),
        },
        Command::Reload(_) => salt_keysync::cli::reload::reload(&cli.config).map(|summary| say!("{summary}")),
        Command::Certs(args) => certs::certs(&args),
        Command::Status(args) => json_errors(args.json, status(&cli.config, &args)),
        Command::Held(args) => json_errors(args.json, held(&cli.config, &args)),
        Command::Release(args) => json_errors(args.json, operate(&cli.config, "release", args)),
        Command::Revert(args) => json_errors(args.json, operate(&cli.config, "revert", args)),
        Command::Demo(args) => {
            if std::env::var_os("SALT_KEYSYNC_LOG").is_some() {
                init_logging(&LogFormat::Text);
            }
            demo::demo(&args)
        }
        Command::Audit(args) => std::process::exit(audit_cmd::audit(&cli.config, &args)),
        Command::Recover(args) => recover(&cli.config, &args),
        Command::Rejoin(args) => rejoin(&cli.config, &args),
        Command::Generate(args) => generate::generate(&args, Cli::command()),
        Command::HandOver(args) => salt_keysync::disk::handover::run(&cli.config, &args.user),
    };
    if let Err(e) = result {
        exit_with(&e, 1);
    }
}

/// sysexits' EX_CONFIG: `run` stopped before it was ready (config,
/// certificates, permissions, a lost state: what only the operator can fix).
/// The unit does not restart it (RestartPreventExitStatus=78), where a
/// restart would only fail the same way five times. A listen address in
/// use is no such problem: EX_TEMPFAIL (75, `net/listen.rs`), restarted.
const EXIT_REFUSED: i32 = 78;

/// Prints `error` for the operator (at err priority when stderr is the
/// journal) and exits with `code`.
fn exit_with(error: &anyhow::Error, code: i32) -> ! {
    use std::os::fd::AsFd;
    let line = format!("salt-keysync: {}", salt_keysync::text::error_chain(error.as_ref()));
    eprintln!("{}", logging::with_priority(std::io::stderr().as_fd(), tracing::Level::ERROR, &line));
    std::process::exit(code)
}

/// With `--json`, an error is JSON too: one object, `{"error": "..."}`, on
/// stdout (where the script reads), and exit status 1.
fn json_errors(json: bool, result: Result<()>) -> Result<()> {
    match result {
        Err(e) if json => {
            say!("{}", serde_json::json!({ "error": salt_keysync::text::error_chain(e.as_ref()) }));
            std::process::exit(1)
        }
        result => result,
    }
}

fn run(path: &std::path::Path, args: &RunArgs) -> Result<()> {
    let mut config = salt_keysync::disk::perms::check_config_file(path)
        .map_err(anyhow::Error::from)
        .and_then(|()| Ok(Config::load(path)?))
        .unwrap_or_else(|e| exit_with(&e, EXIT_REFUSED));
    if args.observe {
        config.mode = salt_keysync::config::Mode::Observe;
    }
    init_logging(&config.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_park(collect_freed_memory)
        .build()
        .context("cannot start the async runtime")?;
    let notifier = salt_keysync::ops::sd_notify::Notifier::from_env();
    let outcome = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        // One pending request is enough: several SIGHUPs in a row are one reload.
        let (reload_tx, reload_rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(on_signals(shutdown.clone(), reload_tx.clone()));
        let options = salt_keysync::agent::RunOptions {
            config_path: Some(path.to_path_buf()),
            reload: Some(reload_rx),
            reload_requests: Some(reload_tx),
            notifier: notifier.clone(),
            // The core's thread returns freed memory when idle, as the workers do.
            on_thread_park: Some(collect_freed_memory),
        };
        // On a worker, not this thread: a worker returns the memory freed on
        // it when it parks (`collect_freed_memory`), as the core's thread,
        // where the start-up runs (a first start reads every key), does.
        tokio::spawn(salt_keysync::agent::run_with(config, None, shutdown, options))
            .await
            .context("the agent's main task failed")?
    });
    match outcome {
        // Another program holds a listen address: the unit starts it again.
        Err(e) if e.downcast_ref::<salt_keysync::net::listen::InUse>().is_some() => {
            exit_with(&e, salt_keysync::net::listen::EXIT_TEMPFAIL)
        }
        Err(e) if !notifier.has_been_ready() => exit_with(&e, EXIT_REFUSED),
        outcome => outcome,
    }
}

fn status(path: &std::path::Path, args: &StatusArgs) -> Result<()> {
    let config = Config::load(path)?;
    let report = salt_keysync::cli::status::query(&config.control_socket)?;
    if args.cluster {
        let cluster = salt_keysync::cli::cluster::cluster(&report);
        if args.json {
            say!("{}", serde_json::to_string_pretty(&cluster)?);
        } else {
            emit(&salt_keysync::cli::cluster::render(&cluster));
        }
    } else if args.json {
        say!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        emit(&salt_keysync::cli::status::render(&report));
    }
    // For scripts and monitoring: an error finding is its own exit status.
    if salt_keysync::ops::findings::any_error(&report.findings) {
        std::process::exit(salt_keysync::cli::status::EXIT_ERROR_FINDING);
    }
    Ok(())
}

fn held(path: &std::path::Path, args: &HeldArgs) -> Result<()> {
    let config = Config::load(path)?;
    let list = salt_keysync::cli::held::query(&config.control_socket)?;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        emit(&salt_keysync::cli::held::render(&list));
    }
    Ok(())
}

/// `release` and `revert`: what the guard holds that they name, shown and
/// asked about as `salt-key` does (unless `-y`; nothing with `--dry-run`;
/// refused without a terminal to ask on), then done.
fn operate(path: &std::path::Path, action: &str, args: OperatorArgs) -> Result<()> {
    use salt_keysync::cli::held;
    use std::io::IsTerminal;
    let config = Config::load(path)?;
    let list = held::query(&config.control_socket)?;
    let plan = held::plan(&list, action, args.origin.as_deref(), &args.ids, args.dry_run);
    if plan.held.is_empty() {
        anyhow::bail!("nothing held here matches (`salt-keysync held` lists what is held)");
    }
    // With --json, stdout is the script's: what a person reads goes to stderr.
    let show = |text: &str| if args.json { eprint!("{text}") } else { emit(text) };
    if args.dry_run {
        if args.json {
            say!("{}", serde_json::to_string_pretty(&plan)?);
        } else {
            emit(&held::render_plan(&plan));
            say!("--dry-run: nothing changed");
        }
        return Ok(());
    }
    if !args.yes {
        show(&held::render_plan(&plan));
        if !std::io::stdin().is_terminal() {
            anyhow::bail!(
                "{action} asks before it acts, and there is no terminal to ask on: run it again with -y to {action} \
                 the {} shown (--dry-run only shows them)",
                plan.held.len()
            );
        }
        show(held::question(action));
        if !held::answered_yes(action, &mut std::io::stdin().lock()) {
            show("not confirmed: nothing changed\n");
            if args.json {
                say!(
                    "{}",
                    serde_json::to_string_pretty(&salt_keysync::ops::held::OperatorReply {
                        action: action.to_string(),
                        ..Default::default()
                    })?
                );
            }
            return Ok(());
        }
    }
    let reply = held::operate(&config.control_socket, &plan)?;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&reply)?);
    } else {
        emit(&held::render_reply(&reply));
    }
    Ok(())
}

fn plan(path: &std::path::Path, args: &PlanArgs) -> Result<()> {
    let config = Config::load(path)?;
    let plan = salt_keysync::cli::plan::query(&config.control_socket)?;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        emit(&salt_keysync::cli::plan::render(&plan));
    }
    Ok(())
}

fn recover(path: &std::path::Path, args: &RecoverArgs) -> Result<()> {
    debug_assert!(args.from_peers);
    let config = Config::load(path)?;
    become_agent_user(&config)?;
    init_logging(&config.log_format);
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")?;
    let done = runtime.block_on(salt_keysync::cli::recover::recover_from_peers(&config, args.force))?;
    for (peer, n) in &done.answered {
        say!("{peer}: {n} decisions");
    }
    for (peer, error) in &done.unreachable {
        say!("{peer}: not reached ({error}); it catches this master up when it is back");
    }
    if let Some(aside) = &done.moved_aside {
        say!("old state moved to {}", aside.display());
    }
    say!(
        "recovered {} decisions into state store {}; start the agent: it applies them first, and files found \
         only on this master are claims, which never override the peers' decisions",
        done.n_decisions,
        done.store_id
    );
    Ok(())
}

fn rejoin(path: &std::path::Path, args: &RejoinArgs) -> Result<()> {
    let config = Config::load(path)?;
    become_agent_user(&config)?;
    init_logging(&config.log_format);
    salt_keysync::cli::rejoin::run(&config, args.yes, args.dry_run, args.force)
}

/// Run by root from a shell, `recover` and `check` act as the agent's user:
/// the owner of state_dir (systemd gives it to the unit's user), else of
/// pki_dir's staging folder. The store and marker `recover` writes are then
/// the agent's, the staging folder it uses is the agent's own (root would
/// take it for a stranger's and replace it), and `check` judges owners as
/// the agent would. Files get mode 0600, as the unit's UMask= makes them.
/// Before any thread exists: credentials change for the whole process.
fn become_agent_user(config: &Config) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let staging = config.pki_dir.join(salt_keysync::disk::pki::STAGING_DIR);
    let owner = [std::fs::metadata(&config.state_dir), std::fs::symlink_metadata(&staging)]
        .into_iter()
        .find_map(|meta| meta.ok().filter(|meta| meta.is_dir()).map(|meta| (meta.uid(), meta.gid())));
    let Some((uid, gid)) = owner else { return Ok(()) };
    if !rustix::process::geteuid().is_root() || uid == 0 {
        return Ok(());
    }
    // SAFETY: system calls on this process's own credentials; the empty
    // group list is a null pointer with a length of 0.
    let changed = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setresgid(gid, gid, gid) == 0
            && libc::setresuid(uid, uid, uid) == 0
    };
    if !changed {
        anyhow::bail!(
            "cannot act as the agent's user (uid {uid}, owner of {}): {}",
            config.state_dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// SIGTERM and SIGINT stop the agent; SIGHUP asks for a config reload.
async fn on_signals(
    shutdown: CancellationToken,
    reload: tokio::sync::mpsc::Sender<Option<salt_keysync::ops::reload::ReloadReply>>,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()), signal(SignalKind::hangup()))
    else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: stopping"); break }
            _ = int.recv() => { tracing::info!("SIGINT: stopping"); break }
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading the config");
                let _ = reload.try_send(None);
            }
        }
    }
    shutdown.cancel();
}

fn init_logging(format: &LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SALT_KEYSYNC_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // journald stamps every line itself and reads a `<N>` priority prefix.
    let under_journald = logging::is_journal(std::os::fd::AsFd::as_fd(&std::io::stderr()));
    use salt_keysync::ops::logging::{Escaped, JournaldPriority};
    match (format, under_journald) {
        (LogFormat::Json, _) => builder.json().init(),
        (LogFormat::Text, true) => {
            let plain = tracing_subscriber::fmt::format().without_time().with_ansi(false);
            builder.with_ansi(false).event_format(JournaldPriority(Escaped(plain))).init()
        }
        // No colours: escape sequences in ids are shown, never sent to the terminal.
        (LogFormat::Text, false) => {
            builder.with_ansi(false).event_format(Escaped(tracing_subscriber::fmt::format().with_ansi(false))).init()
        }
    }
}

#[cfg(test)]
mod tests {
    /// The option set is mimalloc's purge delay: at its default (1000 ms in
    /// mimalloc v3, 10 ms in v2) until set, then 0.
    #[cfg(not(feature = "system-allocator"))]
    #[test]
    fn the_option_set_is_mimallocs_purge_delay() {
        // SAFETY: reads an option.
        let default = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert!(default == 1000 || default == 10, "option {} is {default}", super::MI_OPTION_PURGE_DELAY);
        super::purge_freed_memory_at_once();
        // SAFETY: reads an option.
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) }, 0);
    }
}
