//! `salt-keysync rejoin`: a master out of contact for longer than
//! `tombstone_ttl` (a standby powered off for months) joins its site again
//! as a new master.
//!
//! Its peers have forgotten the deletes it missed, so whatever it holds
//! that they do not may be a key deleted there: nothing it holds may be
//! offered, not even as a first-start claim (an accepted key beats absent).
//! The agent therefore offers nothing once stale (`keysync_machine`'s
//! `node/stale.rs`), and `rejoin`, with the agent stopped, sets aside what
//! it would offer: the state store and every accepted or rejected key file,
//! copied into `state_dir/rejoin-<time>/` and removed from the key folders
//! (pending keys stay). A new, empty store and marker follow, so the next
//! start is a first start on folders that decide nothing: the agent fetches
//! the site's state from its peers, and keys only this master held come
//! back as pending when their minions reconnect.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::config::Config;
use crate::core::{Decision, Folder, MinionId, Slot, Verdict};
use crate::disk::state_guard;
use crate::disk::store::{Store, StoreError};

/// What `rejoin` sets aside, shown before it does.
#[derive(Debug)]
pub struct Preview {
    /// The last completed comparison with a peer, if the store has one.
    pub last_contact_ms: Option<u64>,
    /// Whether that is longer ago than `tombstone_ttl`.
    pub stale: bool,
    /// The accepted and rejected key files.
    pub keys: Vec<(Folder, String)>,
}

/// What `rejoin` did.
#[derive(Debug)]
pub struct Rejoined {
    pub aside: PathBuf,
    pub n_keys: usize,
    pub store_id: String,
    /// Why `.dfn` could not be dropped, if it could not.
    pub dfn_error: Option<String>,
}

/// Looks at the state and folders of `config` and, unless `confirm`
/// declines the preview, sets them aside. `force`: also when the master is
/// not stale.
pub fn rejoin(config: &Config, force: bool, confirm: impl FnOnce(&Preview) -> bool) -> Result<Option<Rejoined>> {
    let pki = crate::setup::open_pki(config, true)?;
    // Not while an agent serves these folders.
    let _serving = pki.lock_serving().map_err(anyhow::Error::msg)?;
    let state_file = config.state_dir.join("state.redb");
    let last_contact_ms = if state_file.exists() {
        let store = Store::open(&config.state_dir, &config.node).map_err(|e| match e {
            StoreError::Db { cause, .. } if matches!(*cause, redb::Error::DatabaseAlreadyOpen) => {
                anyhow::anyhow!("{} is in use: stop the agent first", state_file.display())
            }
            e => anyhow::Error::new(e),
        })?;
        store.load()?.last_contact_ms
    } else {
        None
    };
    let ttl = config.timings.tombstone_ttl;
    let now_ms = crate::node::wall_ms();
    let stale = last_contact_ms.is_some_and(|last| now_ms.saturating_sub(last) > ttl.as_millis() as u64);
    if !stale && !force {
        let when = match last_contact_ms {
            Some(last) => format!(
                "its last contact with a peer was {} ago",
                humantime::format_duration(Duration::from_secs(now_ms.saturating_sub(last) / 1000))
            ),
            None => "its store has no contact with a peer on record".to_string(),
        };
        bail!(
            "this master is not stale: {when}, within tombstone_ttl ({} days). rejoin is for a master out of \
             contact for longer; --force sets its keys aside anyway",
            ttl.as_secs() / 86_400
        );
    }
    let listed = pki.list().with_context(|| format!("cannot list the key folders in {}", config.pki_dir.display()))?;
    let keys: Vec<(Folder, String)> = listed
        .into_iter()
        .filter(|(folder, name)| matches!(folder, Folder::Accepted | Folder::Rejected) && MinionId::parse(name).is_ok())
        .collect();
    let preview = Preview { last_contact_ms, stale, keys };
    if !confirm(&preview) {
        return Ok(None);
    }

    let secs = now_ms / 1000;
    let aside = config.state_dir.join(format!("rejoin-{secs}"));
    let mut dirs = std::fs::DirBuilder::new();
    dirs.mode(0o700);
    for folder in [Folder::Accepted, Folder::Rejected] {
        let path = aside.join(folder.dir_name());
        dirs.recursive(true).create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    }
    // Copied first, each through the folder's own descriptor (a symlink
    // or anything but one regular file is refused and left where it is).
    let mut removed = Vec::new();
    for (folder, name) in &preview.keys {
        let Slot::Key(key) = pki.read_slot(*folder, name) else { continue };
        let copy = aside.join(folder.dir_name()).join(name);
        save(&copy, key.bytes())?;
        removed.push(MinionId::parse(name).expect("listed as a valid id"));
    }
    if state_file.exists() {
        let to = aside.join("state.redb");
        std::fs::rename(&state_file, &to)
            .with_context(|| format!("cannot move {} to {}", state_file.display(), to.display()))?;
    }
    removed.sort_unstable();
    removed.dedup();
    for id in &removed {
        let delete = Decision {
            id: id.clone(),
            verdict: Verdict::Deleted,
            version: crate::core::Version::new(now_ms << 16, config.node.as_str()),
            context: Default::default(),
            relays: Default::default(),
            reached: Default::default(),
        };
        pki.apply(&delete).with_context(|| format!("cannot remove {id}'s key (its copy is in {})", aside.display()))?;
    }
    pki.sync().with_context(|| format!("cannot flush {}", config.pki_dir.display()))?;
    let store = Store::open(&config.state_dir, &config.node)?;
    state_guard::write_marker(&pki, store.id(), &config.node)?;
    // Keys left minions/: the master rotates its AES key, so that their
    // minions stop hearing it until they are accepted again.
    let dfn_error = if preview.keys.iter().any(|(folder, _)| *folder == Folder::Accepted) {
        let owner = crate::setup::salt_owner(config)?;
        let master_id = crate::setup::master_id(config);
        crate::disk::pki::drop_dfn(&config.salt.cachedir, &master_id, owner, &pki.trust())
            .err()
            .map(|e| format!("cannot drop {}/.dfn: {e}", config.salt.cachedir.display()))
    } else {
        None
    };
    Ok(Some(Rejoined { aside, n_keys: removed.len(), store_id: store.id().to_string(), dfn_error }))
}

/// `salt-keysync rejoin`: shows what [`rejoin`] sets aside, asks unless
/// `yes` (nothing changes with `dry_run`, nor without a terminal to ask
/// on), and says what it did.
pub fn run(config: &Config, yes: bool, dry_run: bool, force: bool) -> Result<()> {
    use std::io::{BufRead, IsTerminal};
    let confirm = |preview: &Preview| {
        let since = match preview.last_contact_ms {
            Some(ms) => humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
                .to_string(),
            None => "never".to_string(),
        };
        let (n_accepted, n_rejected) = preview.keys.iter().fold((0, 0), |(a, r), (folder, _)| match folder {
            Folder::Accepted => (a + 1, r),
            _ => (a, r + 1),
        });
        crate::say!(
            "last contact with a peer: {since}{}",
            if preview.stale { " (longer ago than tombstone_ttl)" } else { "" }
        );
        for (folder, name) in &preview.keys {
            crate::say!("  {:<16} {name}", folder.dir_name());
        }
        crate::say!(
            "sets aside the state store and {n_accepted} accepted and {n_rejected} rejected key(s) into {}/rejoin-<time>/; \
             the agent then joins its peers as a new master",
            config.state_dir.display()
        );
        if dry_run {
            crate::say!("--dry-run: nothing changed");
            return false;
        }
        if yes {
            return true;
        }
        if !std::io::stdin().is_terminal() {
            crate::say!("not confirmed (no terminal): run it again with -y");
            return false;
        }
        crate::cli::emit("Proceed? [n/y] ");
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        matches!(answer.trim(), "y" | "Y" | "yes")
    };
    let Some(done) = rejoin(config, force, confirm)? else {
        return Ok(());
    };
    if let Some(error) = &done.dfn_error {
        crate::say!(
            "WARNING: {error}; restart salt-master so that the minions whose keys were set aside stop hearing it"
        );
    }
    crate::say!(
        "set aside {} key(s) and the state store in {}; new state store {}: start the agent, it joins its peers as a \
         new master",
        done.n_keys,
        done.aside.display(),
        done.store_id
    );
    Ok(())
}

fn save(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(bytes).and_then(|()| file.sync_all()).with_context(|| format!("cannot write {}", path.display()))
}
