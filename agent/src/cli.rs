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
pub mod table;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once stdout's reader has gone (`salt-keysync plan --json | head`).
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// Writes `text` to stdout, for the person or script that ran the command.
/// Once the reader has gone (a broken pipe: `| head` read enough), the rest
/// of the output is dropped and the command ends as it would have, where
/// `print!` panicked; any other failure to write (a full disk under a
/// redirection) ends the command with status 1.
pub fn emit(text: &str) {
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => STDOUT_GONE.store(true, Ordering::Relaxed),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "salt-keysync: cannot write the output: {e}");
            std::process::exit(1)
        }
    }
}

/// `println!` for what the commands print: [`emit`] with a newline.
#[macro_export]
macro_rules! say {
    () => {
        $crate::cli::emit("\n")
    };
    ($($arg:tt)*) => {
        $crate::cli::emit(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `-c`/`--config`, or `SALT_KEYSYNC_CONFIG` (the option wins), flattened
/// into the subcommands that read the config file (and only those: `certs`
/// and `demo` would take it and ignore it). Global below them, so `audit
/// verify --config FILE` works too.
#[derive(clap::Args, Clone, Debug)]
pub struct ConfigArg {
    /// Config file.
    #[arg(short, long, global = true, env = "SALT_KEYSYNC_CONFIG", default_value = crate::config::DEFAULT_CONFIG)]
    pub config: std::path::PathBuf,
}
