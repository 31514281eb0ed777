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
pub mod reload;
pub mod status;
