//! inotify on the three key folders (through `notify`), translated into the
//! settler's vocabulary and handed to the driver over a channel.

use std::path::{Path, PathBuf};

use notify::event::{AccessKind, AccessMode, EventKind, EventKindMask, ModifyKind, RenameMode};
use notify::{Config, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::core::settle::FsChange;
use crate::core::Folder;

#[derive(Debug)]
pub enum WatchEvent {
    Change {
        folder: Folder,
        name: String,
        change: FsChange,
    },
    /// Events were lost (IN_Q_OVERFLOW) or the watch failed: read everything.
    Rescan(String),
}

/// What the kernel reports: names created, written, renamed and removed, and
/// files closed after writing. Not opens and reads, nor mode and owner
/// changes: every key the agent reads or adopts (and every read by Salt or a
/// backup) would wake the watcher for nothing, and a `salt-key -A` burst
/// means tens of thousands of them. (MODIFY_NAME: notify reports renames as
/// name changes.)
pub const WATCHED: EventKindMask = EventKindMask::CREATE
    .union(EventKindMask::REMOVE)
    .union(EventKindMask::MODIFY_DATA)
    .union(EventKindMask::MODIFY_NAME)
    .union(EventKindMask::ACCESS_CLOSE);

/// Keeps the inotify watches alive; dropping it stops them.
pub struct FolderWatch {
    watcher: std::sync::Mutex<RecommendedWatcher>,
    pki_dir: PathBuf,
}

impl FolderWatch {
    /// Watches a key folder anew after it was replaced by another folder
    /// (the old watch followed the old folder's inode).
    pub fn rewatch(&self, folder: Folder) -> notify::Result<()> {
        let path = self.pki_dir.join(folder.dir_name());
        let mut watcher = self.watcher.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = watcher.unwatch(&path);
        watcher.watch(&path, RecursiveMode::NonRecursive)
    }
}

pub fn watch(pki_dir: &Path) -> notify::Result<(FolderWatch, mpsc::UnboundedReceiver<WatchEvent>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let folders: Vec<(Folder, PathBuf)> = Folder::ALL.iter().map(|&f| (f, pki_dir.join(f.dir_name()))).collect();
    let lookup = folders.clone();
    let overflow = crate::fault::inotify_overflow();
    let mut n_seen: u64 = 0;
    let handler = move |result: notify::Result<notify::Event>| {
        if let Some((skip, drop)) = overflow {
            // Test-only (feature `fault-injection`): lose events as a full kernel queue would.
            n_seen += 1;
            if n_seen > skip && n_seen <= skip + drop {
                if n_seen == skip + drop {
                    let _ = tx.send(WatchEvent::Rescan("inotify queue overflow (injected)".into()));
                }
                return;
            }
        }
        let events = match result {
            Ok(event) => translate(&lookup, &event),
            Err(e) => vec![WatchEvent::Rescan(e.to_string())],
        };
        for event in events {
            // The receiver is gone only when the agent shuts down.
            let _ = tx.send(event);
        }
    };
    let mut watcher = RecommendedWatcher::new(handler, Config::default().with_event_kinds(WATCHED))?;
    for (_, path) in &folders {
        watcher.watch(path, RecursiveMode::NonRecursive)?;
    }
    Ok((FolderWatch { watcher: std::sync::Mutex::new(watcher), pki_dir: pki_dir.to_path_buf() }, rx))
}

fn translate(folders: &[(Folder, PathBuf)], event: &notify::Event) -> Vec<WatchEvent> {
    if event.need_rescan() {
        return vec![WatchEvent::Rescan("inotify queue overflow".into())];
    }
    let change_of = || -> Option<FsChange> {
        Some(match event.kind {
            EventKind::Create(_) => FsChange::Written,
            EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any | ModifyKind::Other) => FsChange::Written,
            EventKind::Modify(ModifyKind::Name(RenameMode::To)) => FsChange::MovedIn,
            EventKind::Modify(ModifyKind::Name(RenameMode::From)) => FsChange::Gone,
            // notify reports each end of a rename (From, To) before the pair
            // (Both): the pair would only repeat them.
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => return None,
            // An unpaired rename: read the name again after the grace period.
            EventKind::Modify(ModifyKind::Name(_)) => FsChange::Gone,
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => FsChange::Closed,
            EventKind::Remove(_) => FsChange::Gone,
            _ => return None,
        })
    };
    let mut out = Vec::new();
    for path in &event.paths {
        let Some(change) = change_of() else { continue };
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else { continue };
        let Some(&(folder, _)) = folders.iter().find(|(_, dir)| dir == parent) else { continue };
        out.push(WatchEvent::Change { folder, name: name.to_string_lossy().into_owned(), change });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// What the agent hears of each kind of file operation: each change once,
    /// and nothing of opens and reads.
    #[tokio::test]
    async fn each_change_is_reported_once_and_reads_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path();
        for folder in Folder::ALL {
            std::fs::create_dir(pki.join(folder.dir_name())).unwrap();
        }
        std::fs::create_dir(pki.join("unwatched")).unwrap();
        std::fs::write(pki.join("minions_pre/web01"), "key").unwrap();
        std::fs::write(pki.join("unwatched/web02"), "key").unwrap();
        let (_watch, mut rx) = watch(pki).unwrap();

        // Reads, as the agent and Salt do all the time.
        std::fs::read(pki.join("minions_pre/web01")).unwrap();
        // salt-key 3006: a rename between two watched folders.
        std::fs::rename(pki.join("minions_pre/web01"), pki.join("minions/web01")).unwrap();
        // The agent's staged write: a rename in from an unwatched folder.
        std::fs::rename(pki.join("unwatched/web02"), pki.join("minions_rejected/web02")).unwrap();
        // A rename out to an unwatched folder, and a removal.
        std::fs::rename(pki.join("minions/web01"), pki.join("unwatched/web01")).unwrap();
        std::fs::remove_file(pki.join("minions_rejected/web02")).unwrap();
        // A file written in place.
        std::fs::write(pki.join("minions_pre/web03"), "key").unwrap();

        let mut seen = Vec::new();
        while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
            match event {
                WatchEvent::Change { folder, name, change } => seen.push((folder, name, change)),
                WatchEvent::Rescan(reason) => panic!("unexpected rescan: {reason}"),
            }
        }
        let want = |folder, name: &str, change| (folder, name.to_string(), change);
        assert_eq!(
            seen,
            vec![
                want(Folder::Pending, "web01", FsChange::Gone),
                want(Folder::Accepted, "web01", FsChange::MovedIn),
                want(Folder::Rejected, "web02", FsChange::MovedIn),
                want(Folder::Accepted, "web01", FsChange::Gone),
                want(Folder::Rejected, "web02", FsChange::Gone),
                want(Folder::Pending, "web03", FsChange::Written),
                want(Folder::Pending, "web03", FsChange::Written),
                want(Folder::Pending, "web03", FsChange::Closed),
            ]
        );
    }
}
