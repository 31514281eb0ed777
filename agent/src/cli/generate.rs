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
            // clap_mangen leaves hidden subcommands (this one) out by itself.
            clap_mangen::generate_to(cli, dir)
                .with_context(|| format!("cannot write man pages into {}", dir.display()))?;
            println!("wrote man pages into {}", dir.display());
        }
        What::Completions { shell, dir } => {
            create_dir(dir)?;
            let mut cli = without_hidden_subcommands(cli);
            let name = cli.get_name().to_string();
            let path = clap_complete::generate_to(*shell, &mut cli, name, dir)
                .with_context(|| format!("cannot write {shell} completions into {}", dir.display()))?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// The same command without its hidden subcommands: clap_complete would
/// offer them, and clap cannot remove a subcommand, so the top level is
/// rebuilt from what completions use: arguments and the visible subcommands
/// with everything below them. (clap's names are `&'static str`, so the
/// name is this binary's, which is the name `Cli` declares.)
/// The binary's name, as `Cli` in main.rs declares it.
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
