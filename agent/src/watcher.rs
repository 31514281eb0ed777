//! inotify on the three key folders (through `notify`), translated into the
//! settler's vocabulary and handed to the driver over a channel.

use std::path::{Path, PathBuf};

use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind, RenameMode};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
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

/// Keeps the inotify watches alive; dropping it stops them.
pub struct FolderWatch {
    _watcher: RecommendedWatcher,
}

pub fn watch(pki_dir: &Path) -> notify::Result<(FolderWatch, mpsc::UnboundedReceiver<WatchEvent>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let folders: Vec<(Folder, PathBuf)> = Folder::ALL.iter().map(|&f| (f, pki_dir.join(f.dir_name()))).collect();
    let lookup = folders.clone();
    let overflow = crate::fault::inotify_overflow();
    let mut n_seen: u64 = 0;
    let mut watcher = notify::recommended_watcher(move |result: notify::Result<notify::Event>| {
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
    })?;
    for (_, path) in &folders {
        watcher.watch(path, RecursiveMode::NonRecursive)?;
    }
    Ok((FolderWatch { _watcher: watcher }, rx))
}

fn translate(folders: &[(Folder, PathBuf)], event: &notify::Event) -> Vec<WatchEvent> {
    if event.need_rescan() {
        return vec![WatchEvent::Rescan("inotify queue overflow".into())];
    }
    let change_of = |idx: usize| -> Option<FsChange> {
        Some(match event.kind {
            EventKind::Create(_) => FsChange::Written,
            EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any | ModifyKind::Other) => FsChange::Written,
            EventKind::Modify(ModifyKind::Name(RenameMode::To)) => FsChange::MovedIn,
            EventKind::Modify(ModifyKind::Name(RenameMode::From)) => FsChange::Gone,
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) if idx == 0 => FsChange::Gone,
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => FsChange::MovedIn,
            // An unpaired rename: read the name again after the grace period.
            EventKind::Modify(ModifyKind::Name(_)) => FsChange::Gone,
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => FsChange::Closed,
            EventKind::Remove(_) => FsChange::Gone,
            _ => return None,
        })
    };
    let mut out = Vec::new();
    for (idx, path) in event.paths.iter().enumerate() {
        let Some(change) = change_of(idx) else { continue };
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else { continue };
        let Some(&(folder, _)) = folders.iter().find(|(_, dir)| dir == parent) else { continue };
        out.push(WatchEvent::Change { folder, name: name.to_string_lossy().into_owned(), change });
    }
    out
}
