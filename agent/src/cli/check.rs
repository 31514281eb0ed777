//! `salt-keysync check`: validates a set-up without starting the agent and
//! says plainly what is wrong.

use std::os::fd::AsFd;
use std::path::Path;

use tracing::Level;

use crate::config::Config;
use crate::net::listen::Tried;
use crate::ops::logging::with_priority;
use crate::setup::{load_tls, pki_options};
use anyhow::{bail, Result};

pub fn check(path: &Path) -> Result<()> {
    let config = Config::load(path)?;
    let mut problems = Vec::new();
    // At err priority when stdout is the journal (check run by a unit).
    let print = |level: Level, line: String| crate::say!("{}", with_priority(std::io::stdout().as_fd(), level, &line));
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
    let tls = load_tls(&config);
    match &tls {
        Ok(tls) => {
            let days_left = (tls.own_not_after() - time::OffsetDateTime::now_utc().unix_timestamp()) / 86_400;
            if days_left < 0 {
                problems.push(format!("tls.cert {} has expired", config.tls.cert.display()));
            } else {
                ok(format!("certificate for {:?}, expires in {days_left} days", config.node));
            }
        }
        Err(e) => problems.push(crate::text::error_chain(e.as_ref())),
    }
    // The agent serving this pki_dir now, if one does (its lock is held).
    let mut serving = None;
    match pki_options(&config, false) {
        Ok(options) => {
            serving = crate::disk::pki::serving_pid(&config.pki_dir, &options.trust).ok().flatten();
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
            match crate::disk::pki::check_cachedir(&config.salt.cachedir, &options.trust) {
                Ok(true) => ok(format!("salt.cachedir {} (owner, mode, no symlinks)", config.salt.cachedir.display())),
                Ok(false) => print(
                    Level::WARN,
                    format!(
                        "WARN salt.cachedir {} does not exist yet: .dfn cannot be dropped until salt-master makes it",
                        config.salt.cachedir.display()
                    ),
                ),
                Err(e) => problems.push(e),
            }
            // What `run` would refuse: a state folder lost, or swapped for another.
            match crate::disk::state_guard::check_offline(&config.pki_dir, &options.trust, &config.state_dir) {
                Ok(note) => ok(note),
                Err(e) => problems.push(e.to_string()),
            }
        }
        Err(e) => problems.push(crate::text::error_chain(e.as_ref())),
    }
    // The store's files: a format this release does not read, another user's, wider than 0600.
    let (store_problems, store_warnings) = crate::disk::store::format::check_files(&config.state_dir);
    problems.extend(store_problems);
    store_warnings.into_iter().for_each(|warning| print(Level::WARN, format!("WARN {warning}")));
    let salt = &config.salt;
    match crate::disk::salt_master::check_master_config(&salt.master_config, salt.master_config_named) {
        Ok(Some(note)) => ok(note),
        Ok(None) => ok(crate::disk::salt_master::defaults_assumed(&salt.master_config)),
        Err(e) => problems.push(e),
    }
    // The addresses `run` listens on, bound and let go at once.
    let metrics = config.metrics_listen.map(|address| ("metrics_listen", address));
    for (what, address) in std::iter::once(("listen", config.listen)).chain(metrics) {
        match crate::net::listen::try_bind(address) {
            Tried::Free => ok(format!("{what} {address} is free")),
            // The running agent's own socket.
            Tried::InUse { holder: Some((pid, _)) } if serving == Some(pid) => {
                ok(format!("{what} {address} in use by the running agent (pid {pid})"))
            }
            Tried::InUse { holder: None } if serving.is_some() => print(
                Level::INFO,
                format!(
                    "note {what} {address} is in use, presumably by the running agent (pid {}) that serves this \
                     pki_dir (this user cannot see which process holds it)",
                    serving.unwrap_or_default()
                ),
            ),
            Tried::InUse { holder } => problems.push(in_use(what, address, holder, serving)),
            Tried::Refused(e) => problems.push(format!("{what}: cannot listen on {address}: {e}")),
        }
    }
    // Each peer, last: the set-up above is this master's own, a peer's state
    // is not (see `probe_peers`).
    let warned = match &tls {
        Ok(tls) => probe_peers(&config, tls, &print),
        Err(_) if !config.peers.is_empty() => {
            print(Level::INFO, "note peers not probed: no usable TLS material (above)".into());
            0
        }
        Err(_) => 0,
    };
    if problems.is_empty() {
        let warned = match warned {
            0 => String::new(),
            n => format!(" ({n} peer warning(s) above: the agent starts anyway and keeps retrying those links)"),
        };
        print(Level::INFO, format!("all checks passed{warned}"));
        return Ok(());
    }
    for problem in &problems {
        print(Level::ERROR, format!("FAIL {problem}"));
    }
    bail!("{} problem(s) found", problems.len())
}

/// Why `run` could not listen on `address`: who holds it, if this user can
/// see it, and what to do.
fn in_use(what: &str, address: std::net::SocketAddr, holder: Option<(u32, String)>, serving: Option<u32>) -> String {
    let by = match &holder {
        Some((pid, name)) => crate::net::listen::describe(*pid, name),
        None => "another program (this user cannot see which: `ss -ltnp` as root names it)".to_string(),
    };
    let not_agent = match serving {
        Some(agent) => format!(", not by the running agent (pid {agent})"),
        None => String::new(),
    };
    format!(
        "{what} {address} is in use by {by}{not_agent}: the agent cannot listen there; stop that program, or \
         choose another {what}"
    )
}

/// How long one peer may take to resolve, connect, shake hands and answer.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Probes every peer at once, each within [`PROBE_TIMEOUT`], and prints one
/// line per peer: `ok   peer NAME ADDRESS`, or `WARN peer NAME ADDRESS:
/// cause`. A peer that is down, or refuses this master, is a warning, not a
/// failure: the agent serves its other peers and keeps retrying this one,
/// and what is wrong may be the peer's to fix (its `[[peer]]` list), so
/// `check && systemctl restart salt-keysync` must not be stopped by it.
/// Returns how many peers were warned about.
fn probe_peers(config: &Config, tls: &keysync_server::TlsSetup, print: &dyn Fn(Level, String)) -> usize {
    if config.peers.is_empty() {
        return 0;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            print(Level::WARN, format!("WARN peers not probed: cannot start the async runtime: {e}"));
            return config.peers.len();
        }
    };
    let mut probes = tokio::task::JoinSet::new();
    for (idx, peer) in config.peers.iter().enumerate() {
        let (peer, tls) = (peer.clone(), tls.clone());
        probes.spawn_on(
            async move {
                (idx, tokio::time::timeout(PROBE_TIMEOUT, keysync_server::probe(&peer.address, &peer.name, &tls)).await)
            },
            runtime.handle(),
        );
    }
    let mut results: Vec<_> = runtime.block_on(probes.join_all());
    results.sort_by_key(|(idx, _)| *idx);
    let mut unreachable = 0;
    for (idx, probed) in results {
        let peer = &config.peers[idx];
        match probed {
            Ok(Ok(addr)) => print(Level::INFO, format!("ok   peer {} {addr}", peer.name)),
            Ok(Err(e)) => {
                unreachable += 1;
                let at = e.addr.map_or_else(|| peer.address.clone(), |addr| addr.to_string());
                let tls_told = keysync_server::alert_received(&e.cause).is_some()
                    || keysync_server::tls_refusal(&e.cause).is_some();
                let why = if tls_told {
                    crate::net::cause::describe(&e.cause, &peer.name, &config.node)
                } else {
                    e.to_string()
                };
                print(Level::WARN, format!("WARN peer {} {at}: {why}", peer.name));
            }
            Err(_) => {
                unreachable += 1;
                print(
                    Level::WARN,
                    format!(
                        "WARN peer {} {}: no answer within {}s (host down, or a firewall drops the port)",
                        peer.name,
                        peer.address,
                        PROBE_TIMEOUT.as_secs()
                    ),
                );
            }
        }
    }
    unreachable
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
