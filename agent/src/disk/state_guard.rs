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

use std::path::{Path, PathBuf};

use crate::disk::pki::Pki;
use crate::disk::store::Store;

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

/// Parses the marker's text.
fn parse(text: &str) -> Marker {
    let field = |key: &str| {
        text.lines().find_map(|line| line.strip_prefix(key).map(|v| v.trim().to_string())).unwrap_or_default()
    };
    Marker { store_id: field("store "), node: field("node ") }
}

/// What the marker in `pki`'s staging folder says, if there is one.
pub fn read_marker(pki: &Pki) -> Result<Option<Marker>, GuardError> {
    let text = pki.read_marker().map_err(|source| GuardError::Read { path: pki.marker_path(), source })?;
    Ok(text.as_deref().map(parse))
}

/// Checks at start-up that `store` is the one that last synced `pki`'s
/// folders. A new store with no marker is a genuine first start; an
/// initialized store with no marker was made before markers existed (the
/// marker is written).
pub fn check(pki: &Pki, store: &Store, state_dir: &Path) -> Result<(), GuardError> {
    let Some(marker) = read_marker(pki)? else { return Ok(()) };
    if marker.store_id == store.id() {
        return Ok(());
    }
    let found = match store.is_initialized() {
        Ok(true) => format!("another state store ({}), restored or copied from elsewhere", store.id()),
        Ok(false) => "no state (a new, empty store)".to_string(),
        Err(e) => format!("a store that cannot be read ({e})"),
    };
    Err(GuardError::Lost {
        marker: pki.marker_path(),
        expected: marker.store_id,
        node: marker.node,
        state: state_dir.to_path_buf(),
        found,
    })
}

/// Writes the marker naming `store_id`.
pub fn write_marker(pki: &Pki, store_id: &str, node: &str) -> Result<(), GuardError> {
    let text = format!(
        "# salt-keysync: the state store that syncs this pki_dir; see docs/recovery.md\nstore {store_id}\nnode {node}\n"
    );
    pki.write_marker(&text).map_err(|source| GuardError::Write { path: pki.marker_path(), source })
}

/// Writes the marker unless it already names `store_id`.
pub fn mark(pki: &Pki, store_id: &str, node: &str) -> Result<(), GuardError> {
    if read_marker(pki)?.is_some_and(|m| m.store_id == store_id) {
        return Ok(());
    }
    write_marker(pki, store_id, node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_start_passes_and_a_lost_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::disk::pki::tests::open(dir.path());
        let state = tempfile::tempdir().unwrap();
        let store = Store::open(state.path(), "a").unwrap();
        check(&pki, &store, state.path()).unwrap();
        store.record(&keysync_machine::node::StoreWrite { initialize: true, ..Default::default() }, "a").unwrap();
        mark(&pki, store.id(), "a").unwrap();
        check(&pki, &store, state.path()).unwrap();
        drop(store);

        let lost = tempfile::tempdir().unwrap();
        let fresh = Store::open(lost.path(), "a").unwrap();
        let err = check(&pki, &fresh, lost.path()).unwrap_err().to_string();
        assert!(err.contains("state lost") && err.contains("no state") && err.contains(RECOVER_COMMAND), "{err}");
    }
}
