//! Ties a pki_dir to the state store that last synced it, so a lost or
//! replaced state folder is detected instead of guessed around.
//!
//! Without this, an agent whose `state_dir` vanished would take its next
//! start for a first start: harmless for its files (bootstrap versions never
//! override the cluster), but every change made on this master while the
//! agent was down would silently become a bootstrap version too, and an
//! operator's accept or delete would lose to the cluster. The agent refuses
//! instead and names the command that rebuilds the state from the peers.
//!
//! The marker `pki_dir/.keysync-staging/.salt-keysync-state` (in the agent's own
//! folder beside the key folders, the only place in pki_dir it may write besides them)
//! holds the store's random id and the node name. It is written once the
//! store is initialized and checked at every start.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::disk::store::Store;

pub const MARKER: &str = ".salt-keysync-state";
pub const RECOVER_COMMAND: &str = "salt-keysync recover --from-peers";

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(
        "state lost: {marker} says this master was synced by state store {expected} (node {node:?}), but {state} \
         holds {found}; refusing to guess which files are decisions. Rebuild the state from the peers with \
         `{RECOVER_COMMAND} --config FILE` (see docs/recovery.md)"
    )]
    Lost { marker: PathBuf, expected: String, node: String, state: PathBuf, found: String },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// What the marker says.
#[derive(Debug, PartialEq, Eq)]
pub struct Marker {
    pub store_id: String,
    pub node: String,
}

/// In the agent's own folder in pki_dir (the staging folder, on the key
/// folders' filesystem): the packaged unit lets the agent write there and in
/// the three key folders only, never next to master.pem.
pub fn marker_path(pki_dir: &Path) -> PathBuf {
    pki_dir.join(crate::disk::pki::STAGING_DIR).join(MARKER)
}

pub fn read_marker(pki_dir: &Path) -> Result<Option<Marker>, GuardError> {
    let path = marker_path(pki_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(GuardError::Read { path, source }),
    };
    let field = |key: &str| {
        text.lines().find_map(|line| line.strip_prefix(key).map(|v| v.trim().to_string())).unwrap_or_default()
    };
    Ok(Some(Marker { store_id: field("store "), node: field("node ") }))
}

/// Checks at start-up that `store` is the one that last synced `pki_dir`.
/// A new store with no marker is a genuine first start; an initialized store
/// with no marker was made before markers existed (the marker is written).
pub fn check(pki_dir: &Path, store: &Store, state_dir: &Path) -> Result<(), GuardError> {
    let Some(marker) = read_marker(pki_dir)? else { return Ok(()) };
    if marker.store_id == store.id() {
        return Ok(());
    }
    let found = match store.is_initialized() {
        Ok(true) => format!("another state store ({}), restored or copied from elsewhere", store.id()),
        Ok(false) => "no state (a new, empty store)".to_string(),
        Err(e) => format!("a store that cannot be read ({e})"),
    };
    Err(GuardError::Lost {
        marker: marker_path(pki_dir),
        expected: marker.store_id,
        node: marker.node,
        state: state_dir.to_path_buf(),
        found,
    })
}

/// Writes the marker naming `store_id` (staged and renamed, mode 0600).
pub fn write_marker(pki_dir: &Path, store_id: &str, node: &str) -> Result<(), GuardError> {
    let path = marker_path(pki_dir);
    let folder = pki_dir.join(crate::disk::pki::STAGING_DIR);
    let staging = folder.join(format!("{MARKER}.tmp"));
    let write = || -> std::io::Result<()> {
        match std::fs::DirBuilder::new().mode(0o700).create(&folder) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let mut file =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&staging)?;
        write!(file, "# salt-keysync: the state store that syncs this pki_dir; see docs/recovery.md\nstore {store_id}\nnode {node}\n")?;
        file.sync_all()?;
        std::fs::rename(&staging, &path)?;
        std::fs::File::open(&folder)?.sync_all()
    };
    write().map_err(|source| GuardError::Write { path, source })
}

/// Writes the marker unless it already names `store_id`.
pub fn mark(pki_dir: &Path, store_id: &str, node: &str) -> Result<(), GuardError> {
    if read_marker(pki_dir)?.is_some_and(|m| m.store_id == store_id) {
        return Ok(());
    }
    write_marker(pki_dir, store_id, node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_start_passes_and_a_lost_store_is_refused() {
        let pki = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let store = Store::open(state.path(), "a").unwrap();
        check(pki.path(), &store, state.path()).unwrap();
        store.record(&[], &[], "a", 1).unwrap();
        mark(pki.path(), store.id(), "a").unwrap();
        check(pki.path(), &store, state.path()).unwrap();
        drop(store);

        let lost = tempfile::tempdir().unwrap();
        let fresh = Store::open(lost.path(), "a").unwrap();
        let err = check(pki.path(), &fresh, lost.path()).unwrap_err().to_string();
        assert!(err.contains("state lost") && err.contains("no state") && err.contains(RECOVER_COMMAND), "{err}");
    }
}
