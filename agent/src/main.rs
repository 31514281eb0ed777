//! The `salt-keysync` command: `run` the agent, `check` a set-up, make
//! `certs` for sites without a PKI, review the `audit` log, ask the running
//! agent for its `status`, `recover` a lost state folder, watch a `demo` cluster.

mod args;
mod memory;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser};
use salt_keysync::cli::{audit_cmd, certs, check, demo, emit, generate};
use salt_keysync::config::{Config, LogFormat, DEFAULT_CONFIG};
use salt_keysync::ops::logging;
use salt_keysync::say;
use tokio_util::sync::CancellationToken;

use args::{Cli, Command, HeldArgs, OperatorArgs, PlanArgs, RecoverArgs, RejoinArgs, RunArgs, StatusArgs};
use memory::{collect_freed_memory, no_transparent_huge_pages, purge_freed_memory_at_once};

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
