//! `salt-keysync check`: validates a set-up without starting the agent and
//! says plainly what is wrong.

use std::os::fd::AsFd;
use std::path::Path;

use tracing::Level;

use crate::config::Config;
use crate::ops::logging::with_priority;
use crate::setup::{load_tls, pki_options};
use anyhow::{bail, Result};

pub fn check(path: &Path) -> Result<()> {
    let config = Config::load(path)?;
    let mut problems = Vec::new();
    // At err priority when stdout is the journal (check run by a unit).
    let print = |level: Level, line: String| println!("{}", with_priority(std::io::stdout().as_fd(), level, &line));
    let ok = |what: String| print(Level::INFO, format!("ok   {what}"));
    ok(format!("config {} ({} peers)", path.display(), config.peers.len()));
    let mut too_open: Vec<String> =
        crate::disk::perms::check_config_file(path).err().map(|e| e.to_string()).into_iter().collect();
    too_open.extend(crate::disk::perms::check_config_paths(&config).iter().map(ToString::to_string));
    // What does not exist was not checked: never "ok" for it (what is
    // missing is a FAIL of its own below, where it is read).
    let missing = crate::disk::perms::missing_paths(&config);
    if too_open.is_empty() && missing.is_empty() {
        ok("permissions of the config, TLS files, state_dir and pki_dir".into());
    } else if !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(|p| p.display().to_string()).collect();
        print(Level::INFO, format!("note permissions not checked for what does not exist: {}", list.join(", ")));
    }
    problems.extend(too_open);
    match load_tls(&config) {
        Ok(tls) => {
            let days_left = (tls.own_not_after() - time::OffsetDateTime::now_utc().unix_timestamp()) / 86_400;
            if days_left < 0 {
                problems.push(format!("tls.cert {} has expired", config.tls.cert.display()));
            } else {
                ok(format!("certificate for {:?}, expires in {days_left} days", config.node));
            }
        }
        Err(e) => problems.push(format!("{e:#}")),
    }
    match pki_options(&config, false) {
        Ok(options) => {
            // The folders as `run` opens them: no symlink anywhere, trusted owners, no
            // mode others can write through.
            let (found, notes) = crate::disk::pki::inspect(&config.pki_dir, &options.trust);
            if found.is_empty() {
                ok(format!("key folders in {} (owners, modes, no symlinks)", config.pki_dir.display()));
            }
            problems.extend(found);
            notes.into_iter().for_each(|note| print(Level::INFO, format!("note {note}")));
            // Every key file is handed to the salt user: a user that cannot chown
            // would start, and then fail every write.
            if let Err(e) = can_give_files_to(options.owner) {
                problems.push(e);
            }
            if config.salt.cachedir.exists() {
                if let Err(e) = crate::disk::pki::dirs::open_path(&config.salt.cachedir, &options.trust) {
                    problems.push(format!("salt.cachedir {e}"));
                }
            }
            // What `run` would refuse: a state folder lost, or swapped for another.
            match crate::disk::state_guard::check_offline(&config.pki_dir, &options.trust, &config.state_dir) {
                Ok(note) => ok(note),
                Err(e) => problems.push(e.to_string()),
            }
        }
        Err(e) => problems.push(format!("{e:#}")),
    }
    match crate::disk::salt_master::check_master_config(&config.salt.master_config) {
        Ok(Some(note)) => ok(note),
        Ok(None) => ok(format!("no master config at {} (defaults assumed)", config.salt.master_config.display())),
        Err(e) => problems.push(e),
    }
    if problems.is_empty() {
        print(Level::INFO, "all checks passed".into());
        return Ok(());
    }
    for problem in &problems {
        print(Level::ERROR, format!("FAIL {problem}"));
    }
    bail!("{} problem(s) found", problems.len())
}

/// Whether this user can make files owned by `owner` (as every key file and
/// `.dfn` the agent writes): tried on a scratch file of its own.
fn can_give_files_to(owner: crate::disk::pki::Owner) -> Result<(), String> {
    let euid = rustix::process::geteuid().as_raw();
    if owner.uid == euid {
        return Ok(());
    }
    let scratch = tempfile::tempfile().map_err(|e| format!("cannot make a scratch file to try a chown: {e}"))?;
    let uid = rustix::fs::Uid::from_raw(owner.uid);
    let gid = rustix::fs::Gid::from_raw(owner.gid);
    rustix::fs::fchown(&scratch, Some(uid), Some(gid)).map_err(|e| {
        format!(
            "this user (uid {euid}) cannot give files to the salt user (uid {}, gid {}): {}; run the agent as \
             root or as that user (salt.user)",
            owner.uid,
            owner.gid,
            std::io::Error::from(e)
        )
    })
}
