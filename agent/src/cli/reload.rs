//! `salt-keysync reload`: asks the running agent, over its control socket,
//! to re-read its config as SIGHUP does, and waits for the outcome. The
//! unit's `ExecReload=`: `systemctl reload` then fails when the new config is
//! refused, and needs no `/bin/kill`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::config::Config;

/// Reloads the agent whose config is `path`; the summary of what changed.
pub fn reload(path: &Path) -> Result<String> {
    // A mistyped path is named as such, not taken for an agent not running.
    if let Err(e) = std::fs::metadata(path) {
        bail!("cannot read config {}: {e}", path.display());
    }
    let socket = control_socket(path);
    let reply = crate::cli::status::ask(&socket, "reload")?;
    let value: serde_json::Value = serde_json::from_str(&reply)
        .with_context(|| format!("the agent at {} gave an unreadable answer: {}", socket.display(), reply.trim()))?;
    let field = |key: &str| value.get(key).and_then(|v| v.as_str()).map(str::to_string);
    // The file the agent read: its own, which may not be the one given here.
    let read = field("config").map(|config| format!(" {config}")).unwrap_or_default();
    if let Some(summary) = field("reloaded") {
        return Ok(format!("reloaded{read}: {summary}"));
    }
    if let Some(reason) = field("refused") {
        bail!("reload of{read} refused, the running config stays in force: {reason}");
    }
    bail!("reload not done: {}", field("error").unwrap_or_else(|| reply.trim().to_string()))
}

/// Where the running agent listens. The new config may be the very thing
/// the agent will refuse, so a config that does not load still gives its
/// `control_socket` or `state_dir` (each top-level line read on its own),
/// else the default: the agent itself then says why it refuses.
fn control_socket(path: &Path) -> PathBuf {
    if let Ok(config) = Config::load(path) {
        return config.control_socket;
    }
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let table: toml::Table = text
        .lines()
        .take_while(|line| !line.trim_start().starts_with('['))
        .filter_map(|line| toml::from_str::<toml::Table>(line).ok())
        .flatten()
        .collect();
    let base = path.parent().unwrap_or(Path::new("."));
    let setting = |key: &str| table.get(key).and_then(|v| v.as_str()).map(|p| base.join(p));
    setting("control_socket")
        .or_else(|| setting("state_dir").map(|dir| dir.join("control.sock")))
        .unwrap_or_else(|| PathBuf::from(crate::config::DEFAULT_STATE_DIR).join("control.sock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_that_does_not_load_still_names_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(&config, "node = \"master-a\"\nstate_dir = \"state\"\nlisten = 12\n").unwrap();
        assert_eq!(control_socket(&config), dir.path().join("state/control.sock"));
        std::fs::write(&config, "control_socket = \"/run/k.sock\"\nnot toml at all\n[tls]\nstate_dir = \"x\"").unwrap();
        assert_eq!(control_socket(&config), PathBuf::from("/run/k.sock"));
        std::fs::write(&config, "not toml at all").unwrap();
        assert_eq!(control_socket(&config), PathBuf::from("/var/lib/salt-keysync/control.sock"));
    }
}
