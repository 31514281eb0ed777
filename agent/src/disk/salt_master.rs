//! What the agent needs to know of the salt-master's own config: whether the
//! key folders are the truth at all.

use std::path::Path;

/// Reads the master config (YAML) and refuses set-ups the agent cannot
/// serve: a key cache driver other than `localfs_key`, or a Salt cluster.
/// `Ok(None)`: no config file at the default path, Salt's defaults assumed
/// (a master that never had one). A path the agent's config names
/// (`named`) that does not exist is refused: a mistyped path would have the
/// agent assume Salt's defaults for a master that has a config, and miss
/// its key cache driver, `cluster_id` and key-acceptance settings. Only
/// top-level `key: value` lines are read, which is how these settings are
/// written. `check` and `run` both call this, so they say the same.
pub fn check_master_config(path: &Path, named: bool) -> Result<Option<String>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && named => {
            return Err(format!(
                "salt.master_config {} does not exist: correct the path, or remove the line to assume Salt's \
                 defaults (as for a master without a config file)",
                path.display()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read salt master config {}: {e}", path.display())),
    };
    let mut in_keys = false;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim_end();
        if line.trim().is_empty() {
            continue;
        }
        let top_level = !line.starts_with([' ', '\t']);
        if top_level {
            in_keys = line.trim() == "keys:";
        }
        let Some((key, value)) = line.trim().split_once(':') else { continue };
        let value = value.trim().trim_matches(['"', '\'']);
        let cache_driver =
            (top_level && key == "keys.cache_driver") || (in_keys && !top_level && key == "cache_driver");
        if cache_driver && !value.is_empty() && value != "localfs_key" {
            return Err(format!(
                "{}: keys.cache_driver is {value:?}; salt-keysync works only with localfs_key (with another driver the key folders are not the truth)",
                path.display()
            ));
        }
        if top_level && key == "cluster_id" && !value.is_empty() && value != "null" && value != "~" {
            return Err(format!(
                "{}: cluster_id is set ({value:?}); a Salt master cluster shares keys itself and salt-keysync must not run beside it",
                path.display()
            ));
        }
    }
    Ok(Some(format!("salt master config {} uses the local key folders", path.display())))
}

/// What `check` says, and `run` logs, of a master config not found at the
/// default path.
pub fn defaults_assumed(path: &Path) -> String {
    format!("no master config at {} (Salt's defaults assumed)", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<Option<String>, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master");
        std::fs::write(&path, text).unwrap();
        check_master_config(&path, true)
    }

    #[test]
    fn refuses_what_the_agent_cannot_serve() {
        assert!(check("interface: 127.0.0.2\nuser: root\n").unwrap().is_some());
        assert!(check("keys.cache_driver: localfs_key\n").is_ok());
        assert!(check("keys.cache_driver: mmap_key\n").unwrap_err().contains("mmap_key"));
        assert!(check("keys:\n  cache_driver: mmap_key\n").unwrap_err().contains("mmap_key"));
        assert!(check("cluster_id: prod\n").unwrap_err().contains("cluster_id is set"));
        assert!(check("cluster_id: null\n# cluster_id: x\n").is_ok());
        assert!(check_master_config(Path::new("/nonexistent/master"), false).unwrap().is_none());
        let named = check_master_config(Path::new("/nonexistent/master"), true).unwrap_err();
        assert!(named.starts_with("salt.master_config /nonexistent/master does not exist"), "{named}");
    }
}
