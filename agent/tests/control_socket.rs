//! Issue 14 item 8: the control socket is never wider than 0600, not even
//! for the moment between its creation and a chmod (a fresh clone once saw
//! 0755 there). Its own test binary: the process's umask is opened wide
//! (0000, the worst an operator's shell could hand the agent) for all of
//! it, and a thread stats the socket's path as fast as it can while it is
//! made, recording every mode it sees.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_is_owner_only_from_its_creation() {
    rustix::process::umask(rustix::fs::Mode::empty());
    for _ in 0..200 {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = dir.path().join("control.sock");
        let (done, saw) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let watcher = {
            let (path, done, saw) = (path.clone(), done.clone(), saw.clone());
            std::thread::spawn(move || {
                let mut seen = std::collections::BTreeSet::new();
                while !done.load(Ordering::Relaxed) {
                    if let Ok(meta) = std::fs::symlink_metadata(&path) {
                        seen.insert(meta.permissions().mode() & 0o777);
                        saw.store(true, Ordering::Relaxed);
                    }
                }
                seen
            })
        };
        let listener = salt_keysync::ops::control::bind(&path, dir.path()).await.unwrap();
        // However loaded the machine: until the watcher has seen the socket once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !saw.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        done.store(true, Ordering::Relaxed);
        let seen = watcher.join().unwrap();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [0o600], "modes seen while the socket was made");
        drop(listener);
    }
}
