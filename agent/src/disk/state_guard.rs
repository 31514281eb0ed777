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

use crate::disk::pki::{Pki, Trust};
use crate::disk::store::{Peek, Store};

/// The way out the agent's messages name: `recover --from-peers`, and the
/// recovery guide where the packages install it (not the repository's
/// `docs/recovery.md`). The store's own errors name them too.
pub use keysync_store::{RECOVERY_GUIDE, RECOVER_COMMAND};

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(
        "state lost: {marker} says this master was synced by state store {expected} (node {node:?}), but {state} \
         holds {found}; refusing to guess which files are decisions. Rebuild the state from the peers with \
         `{RECOVER_COMMAND} --config FILE` (see {RECOVERY_GUIDE})"
    )]
    Lost { marker: PathBuf, expected: String, node: String, state: PathBuf, found: String },
    // Causes are in the messages, not `source()`s: `{:#}` would print them twice.
    #[error("cannot read {path}: {cause}{}", crate::disk::handover::hint(.cause))]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("cannot write {path}: {cause}")]
    Write { path: PathBuf, cause: std::io::Error },
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
    let text = pki.read_marker().map_err(|cause| GuardError::Read { path: pki.marker_path(), cause })?;
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
        Ok(true) => swapped(store.id()),
        Ok(false) => "no state (a new, empty store)".to_string(),
        Err(e) => format!("a store that cannot be read ({e})"),
    };
    Err(lost(pki.marker_path(), marker, state_dir, found))
}

/// [`check`] for `salt-keysync check`, which must change nothing (no store
/// created, no staging folder made or moved): the same verdicts from a
/// read-only look at the marker and at `state_dir`. Ok: what it found.
pub fn check_offline(pki_dir: &Path, trust: &Trust, state_dir: &Path) -> Result<String, GuardError> {
    let marker_path = pki_dir.join(crate::disk::pki::STAGING_DIR).join(crate::disk::pki::MARKER);
    let text = crate::disk::pki::peek_marker(pki_dir, trust)
        .map_err(|cause| GuardError::Read { path: marker_path.clone(), cause })?;
    let Some(marker) = text.as_deref().map(parse) else {
        return Ok(format!("no state marker in {} yet: a first start", pki_dir.display()));
    };
    let found = match Store::peek(state_dir) {
        Ok(Peek::InUse) => return Ok("state store in use by the running agent".to_string()),
        Ok(Peek::Found { id, .. }) if id == marker.store_id => {
            return Ok(format!("state store {id} is the one {} names", marker_path.display()))
        }
        Ok(Peek::Missing) => "no state (state.redb is missing)".to_string(),
        Ok(Peek::Found { id, initialized: true }) => swapped(&id),
        Ok(Peek::Found { initialized: false, .. }) => "no state (a new, empty store)".to_string(),
        Err(e) => format!("a store that cannot be read ({e})"),
    };
    Err(lost(marker_path, marker, state_dir, found))
}

fn swapped(id: &str) -> String {
    format!("another state store ({id}), restored or copied from elsewhere")
}

fn lost(marker_path: PathBuf, marker: Marker, state_dir: &Path, found: String) -> GuardError {
    GuardError::Lost {
        marker: marker_path,
        expected: marker.store_id,
        node: marker.node,
        state: state_dir.to_path_buf(),
        found,
    }
}

/// Writes the marker naming `store_id`.
pub fn write_marker(pki: &Pki, store_id: &str, node: &str) -> Result<(), GuardError> {
    let text = format!(
        "# salt-keysync: the state store that syncs this pki_dir; see {RECOVERY_GUIDE}\nstore {store_id}\nnode {node}\n"
    );
    pki.write_marker(&text).map_err(|cause| GuardError::Write { path: pki.marker_path(), cause })
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

    /// `check` (the command) saw a lost state as healthy: the unit then
    /// failed at every start while `check` passed (issue 18).
    #[test]
    fn the_offline_check_tells_what_the_start_would_refuse_and_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::disk::pki::tests::open(dir.path());
        let trust = pki.trust();
        let state = tempfile::tempdir().unwrap();
        let note = check_offline(dir.path(), &trust, state.path()).unwrap();
        assert!(note.contains("first start"), "{note}");
        let store = Store::open(state.path(), "a").unwrap();
        let id = store.id().to_string();
        store.record(&keysync_machine::node::StoreWrite { initialize: true, ..Default::default() }, "a").unwrap();
        mark(&pki, &id, "a").unwrap();
        assert!(check_offline(dir.path(), &trust, state.path()).unwrap().contains("in use by the running agent"));
        drop(store);
        let note = check_offline(dir.path(), &trust, state.path()).unwrap();
        assert!(note.contains(&id), "{note}");

        let lost = tempfile::tempdir().unwrap();
        let err = check_offline(dir.path(), &trust, lost.path()).unwrap_err().to_string();
        assert!(err.contains("state lost") && err.contains("state.redb is missing"), "{err}");
        assert!(!lost.path().join("state.redb").exists(), "check must not create a store");

        let other = tempfile::tempdir().unwrap();
        let swapped = Store::open(other.path(), "a").unwrap();
        swapped.record(&keysync_machine::node::StoreWrite { initialize: true, ..Default::default() }, "a").unwrap();
        drop(swapped);
        let err = check_offline(dir.path(), &trust, other.path()).unwrap_err().to_string();
        assert!(err.contains("another state store"), "{err}");
    }
}
