//! The subcommands other than `run`: each parses its own arguments and
//! prints for a person (or `--json` for scripts).

pub mod audit_cmd;
pub mod certs;
pub mod check;
pub mod cluster;
pub mod demo;
pub mod generate;
pub mod held;
pub mod plan;
pub mod recover;
pub mod rejoin;
pub mod reload;
pub mod status;

/// `--config`, flattened into the subcommands that read the config file
/// (and only those: `certs` and `demo` would take it and ignore it). Global
/// below them, so `audit verify --config FILE` works too.
#[derive(clap::Args, Clone, Debug)]
pub struct ConfigArg {
    /// Config file.
    #[arg(long, global = true, default_value = crate::config::DEFAULT_CONFIG)]
    pub config: std::path::PathBuf,
}
