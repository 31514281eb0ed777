//! Binding the control socket leaves the process's umask alone: another
//! thread creating files meanwhile (another agent in the same test process,
//! a task of this one) gets the modes it asked for. It once set the umask to
//! 0177 around the bind, and folders made at that moment came out 0600
//! instead of 0700 (seen in the integration suite under load). Its own test
//! binary, as it sets the umask.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_leaves_the_umask_alone() {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    let root = tempfile::tempdir().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let maker = {
        let (root, done) = (root.path().to_path_buf(), done.clone());
        std::thread::spawn(move || {
            let mut modes = std::collections::BTreeSet::new();
            let mut n = 0u64;
            while !done.load(Ordering::Relaxed) {
                let dir = root.join(format!("d{n}"));
                std::fs::DirBuilder::new().mode(0o777).create(&dir).unwrap();
                modes.insert(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777);
                std::fs::remove_dir(&dir).unwrap();
                n += 1;
            }
            modes
        })
    };
    for i in 0..300 {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = dir.path().join(format!("control{i}.sock"));
        drop(salt_keysync::ops::control::bind(&path, dir.path()).await.unwrap());
    }
    done.store(true, Ordering::Relaxed);
    let modes = maker.join().unwrap();
    assert_eq!(modes.into_iter().collect::<Vec<_>>(), [0o755], "folders made while sockets were bound");
}
