//! The `salt-keysync` command: `run` the agent, `check` a set-up, make
//! `certs` for sites without a PKI.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use salt_keysync::config::{Config, LogFormat, DEFAULT_CONFIG};
use tokio_util::sync::CancellationToken;

mod certs;
mod check;
mod generate;

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
    #[command(
        long_about = "Run the agent in the foreground: watch the master's key folders, replicate \
                      accept/reject/delete decisions to the peers and apply theirs. Logs go to \
                      stderr (journald under systemd); SIGTERM or SIGINT stops it cleanly.",
        after_help = RUN_EXAMPLES
    )]
    Run,
    /// Validate the config, certificates and the salt-master set-up without starting.
    #[command(
        long_about = "Validate a set-up without starting the agent: the config file, the TLS \
                      certificates (chain, node name, expiry), the three key folders, the salt \
                      user, and that the master uses the local key store. Prints one line per \
                      check; exits 1 if any failed.",
        after_help = CHECK_EXAMPLES
    )]
    Check,
    /// Make a CA and node certificates for sites without a PKI.
    Certs(certs::CertsArgs),
    /// Write man pages or shell completions (used to build the packages).
    #[command(hide = true, after_help = GENERATE_EXAMPLES)]
    Generate(generate::GenerateArgs),
}

const RUN_EXAMPLES: &str = "Examples:
  salt-keysync run                                  # /etc/salt-keysync/config.toml
  salt-keysync run --config ./config.toml
  SALT_KEYSYNC_LOG=debug salt-keysync run           # more detail
  systemctl start salt-keysync                      # as packaged (runs `check` first)";

const CHECK_EXAMPLES: &str = "Examples:
  salt-keysync check
  salt-keysync check --config /etc/salt-keysync/config.toml && systemctl restart salt-keysync";

const GENERATE_EXAMPLES: &str = "Examples:
  salt-keysync generate man target/man
  salt-keysync generate completions bash target/completions";

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run => run(&cli.config),
        Command::Check => check::check(&cli.config),
        Command::Certs(args) => certs::certs(&args),
        Command::Generate(args) => generate::generate(&args, Cli::command()),
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
