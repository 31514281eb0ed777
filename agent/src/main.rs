//! The `salt-keysync` command: `run` the agent, `check` a set-up, make
//! `certs` for sites without a PKI, `recover` a lost state folder.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use salt_keysync::config::{Config, LogFormat, DEFAULT_CONFIG};
use tokio_util::sync::CancellationToken;

mod certs;
mod check;

#[derive(Parser)]
#[command(name = "salt-keysync", version, about = "Replicates salt-key decisions between SaltStack masters")]
struct Cli {
    /// Config file.
    #[arg(long, global = true, default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent in the foreground (for systemd).
    Run,
    /// Validate the config, certificates and the salt-master set-up without starting.
    Check,
    /// Make a CA and node certificates for sites without a PKI.
    Certs(certs::CertsArgs),
    /// Rebuild a lost or corrupt state folder from the peers (the agent must be stopped).
    #[command(after_help = RECOVER_EXAMPLES)]
    Recover(RecoverArgs),
}

const RECOVER_EXAMPLES: &str = "\
The agent refuses to start when its state folder is gone or unreadable but the
key folders were already synced (pki_dir/.salt-keysync-state names the state
store). This fetches every decision the reachable peers hold, moves the old
store aside, and leaves the decisions for the next start to apply; the files on
this master are then treated like a first start and never override the peers.

Examples:
  systemctl stop salt-keysync
  salt-keysync recover --from-peers --config /etc/salt-keysync/config.toml
  systemctl start salt-keysync

  # state restored from an old backup (it looks healthy, but is stale):
  salt-keysync recover --from-peers --force

See docs/recovery.md for every recovery case.";

#[derive(clap::Args)]
struct RecoverArgs {
    /// Rebuild from the configured peers (the only source there is; required).
    #[arg(long, required = true)]
    from_peers: bool,
    /// Rebuild even when the current state looks healthy (e.g. restored from a backup).
    #[arg(long)]
    force: bool,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run => run(&cli.config),
        Command::Check => check::check(&cli.config),
        Command::Certs(args) => certs::certs(&args),
        Command::Recover(args) => recover(&cli.config, &args),
    };
    if let Err(e) = result {
        eprintln!("salt-keysync: {e:#}");
        std::process::exit(1);
    }
}

fn run(path: &std::path::Path) -> Result<()> {
    let config = Config::load(path)?;
    init_logging(&config.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(stop_on_signal(shutdown.clone()));
        salt_keysync::agent::run(config, None, shutdown).await
    })
}

fn recover(path: &std::path::Path, args: &RecoverArgs) -> Result<()> {
    debug_assert!(args.from_peers);
    let config = Config::load(path)?;
    init_logging(&config.log_format);
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")?;
    let done = runtime.block_on(salt_keysync::recover::recover_from_peers(&config, args.force))?;
    for (peer, n) in &done.answered {
        println!("{peer}: {n} decisions");
    }
    for (peer, error) in &done.unreachable {
        println!("{peer}: not reached ({error}); it catches this master up when it is back");
    }
    if let Some(aside) = &done.moved_aside {
        println!("old state moved to {}", aside.display());
    }
    println!(
        "recovered {} decisions into state store {}; start the agent: it applies them first, and files found \
         only on this master get bootstrap versions that never override the peers",
        done.n_decisions, done.store_id
    );
    Ok(())
}

async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = int.recv() => tracing::info!("SIGINT: stopping"),
    }
    shutdown.cancel();
}

fn init_logging(format: &LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SALT_KEYSYNC_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // journald stamps every line itself.
    let under_journald = std::env::var_os("JOURNAL_STREAM").is_some();
    match (format, under_journald) {
        (LogFormat::Json, _) => builder.json().init(),
        (LogFormat::Text, true) => builder.without_time().with_ansi(false).init(),
        (LogFormat::Text, false) => builder.init(),
    }
}
