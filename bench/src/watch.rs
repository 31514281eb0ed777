//! inotify (notify crate) on the peers' key folders: every event is
//! timestamped the moment it is read, so a peer's final file state is dated
//! by the event that produced it, not by when the benchmark looked.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use keysync_tests::salt_ops::{path, FOLDERS};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};

/// One file event on peer `peer`, or `None` for a lost-events signal.
struct Seen {
    at: Instant,
    peer: usize,
    name: Option<String>,
}

/// What a peer's folders must say about an id once a decision is applied.
#[derive(Clone, Debug)]
pub enum Final {
    /// The id is in `folder` only, holding exactly these bytes.
    In(&'static str, Vec<u8>),
    /// The id is in no folder.
    Gone,
}

impl Final {
    pub fn holds(&self, pki: &Path, id: &str) -> bool {
        FOLDERS.iter().all(|folder| {
            let path = path(pki, folder, id);
            match self {
                Final::In(target, bytes) if target == folder => std::fs::read(&path).is_ok_and(|b| &b == bytes),
                _ => path.symlink_metadata().is_err(),
            }
        })
    }
}

/// Watches the three key folders of each peer.
pub struct PeerWatch {
    pkis: Vec<PathBuf>,
    rx: mpsc::Receiver<Seen>,
    _watchers: Vec<RecommendedWatcher>,
}

impl PeerWatch {
    pub fn new(pkis: &[&Path]) -> anyhow::Result<PeerWatch> {
        let (tx, rx) = mpsc::channel();
        let mut watchers = Vec::new();
        for (peer, pki) in pkis.iter().enumerate() {
            let tx = tx.clone();
            let handler = move |event: notify::Result<notify::Event>| {
                let at = Instant::now();
                let Ok(event) = event else {
                    let _ = tx.send(Seen { at, peer, name: None });
                    return;
                };
                if event.need_rescan() {
                    let _ = tx.send(Seen { at, peer, name: None });
                }
                for path in &event.paths {
                    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                    // The agent's staging files start with a dot; Salt ignores them too.
                    if name.as_deref().is_some_and(|n| !n.starts_with('.')) {
                        let _ = tx.send(Seen { at, peer, name });
                    }
                }
            };
            let mut watcher = RecommendedWatcher::new(handler, crate::watch_config())?;
            for folder in FOLDERS {
                watcher.watch(&pki.join(folder), RecursiveMode::NonRecursive)?;
            }
            watchers.push(watcher);
        }
        Ok(PeerWatch { pkis: pkis.iter().map(|p| p.to_path_buf()).collect(), rx, _watchers: watchers })
    }

    /// Forgets events of earlier operations.
    pub fn drain(&self) {
        while self.rx.try_recv().is_ok() {}
    }

    /// Waits for the first event on a key file on any peer; returns when it
    /// was read (`None`: none within `timeout`). The event is consumed: a
    /// [`PeerWatch::wait_all`] after this looks at its id at a quiet moment.
    pub fn wait_first_event(&self, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            if let Seen { at, name: Some(_), .. } = self.rx.recv_timeout(left).ok()? {
                return Some(at);
            }
        }
    }

    /// Waits until every peer's folders say `want` about `id`; returns, per
    /// peer, the time from `t0` to the last event on `id` before its state
    /// was seen final (`None`: not final within `timeout`).
    pub fn wait_final(&self, id: &str, want: &Final, t0: Instant, timeout: Duration) -> Vec<Option<Duration>> {
        let n = self.pkis.len();
        let mut last: Vec<Option<Instant>> = vec![None; n];
        let mut done: Vec<Option<Duration>> = vec![None; n];
        let deadline = t0 + timeout;
        loop {
            for peer in 0..n {
                if done[peer].is_none() && want.holds(&self.pkis[peer], id) {
                    let at = last[peer].unwrap_or_else(Instant::now);
                    done[peer] = Some(at.saturating_duration_since(t0));
                }
            }
            if done.iter().all(Option::is_some) {
                return done;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return done };
            let Ok(first) = self.rx.recv_timeout(left) else { return done };
            for seen in std::iter::once(first).chain(self.rx.try_iter()) {
                if seen.name.as_deref() == Some(id) {
                    last[seen.peer] = Some(seen.at);
                }
            }
        }
    }

    /// Waits until every peer's folders say `want(id)` for every id; returns,
    /// per peer, the time from `t0` to the event that completed it. Files are
    /// read only once every missing id has had an event since its last check
    /// (or after a quiet moment), not at every event: reading 10,000 files
    /// per peer while the agents write them would take CPU from them.
    pub fn wait_all(
        &self,
        ids: &[String],
        want: impl Fn(&str) -> Final,
        t0: Instant,
        timeout: Duration,
    ) -> Vec<Option<Duration>> {
        let n = self.pkis.len();
        let mut missing: Vec<HashSet<&str>> = vec![ids.iter().map(String::as_str).collect(); n];
        // Per peer: the missing ids with an event since their last check.
        let mut touched: Vec<HashSet<&str>> = vec![HashSet::new(); n];
        let mut last_event: Vec<Option<Instant>> = vec![None; n];
        let mut done: Vec<Option<Duration>> = vec![None; n];
        // No look at t0: the events since the last `drain` (the operation's
        // own included) say which ids may have arrived.
        let mut full_check = vec![false; n];
        let deadline = t0 + timeout;
        loop {
            for peer in 0..n {
                if done[peer].is_some() || !(full_check[peer] || touched[peer].len() == missing[peer].len()) {
                    continue;
                }
                // Lost events, a quiet moment, or every missing id touched: look at them all.
                let pki = &self.pkis[peer];
                missing[peer].retain(|id| !want(id).holds(pki, id));
                // Each id left needs a new event before it is read again.
                touched[peer].clear();
                full_check[peer] = false;
                if missing[peer].is_empty() {
                    done[peer] = Some(last_event[peer].unwrap_or_else(Instant::now).saturating_duration_since(t0));
                }
            }
            if done.iter().all(Option::is_some) {
                return done;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return done };
            match self.rx.recv_timeout(left.min(Duration::from_millis(200))) {
                Err(mpsc::RecvTimeoutError::Timeout) => full_check.iter_mut().for_each(|c| *c = true),
                Err(mpsc::RecvTimeoutError::Disconnected) => return done,
                Ok(first) => {
                    for seen in std::iter::once(first).chain(self.rx.try_iter()) {
                        let peer = seen.peer;
                        if done[peer].is_some() {
                            continue;
                        }
                        let Some(name) = seen.name else {
                            full_check[peer] = true;
                            continue;
                        };
                        if let Some(&id) = missing[peer].get(name.as_str()) {
                            touched[peer].insert(id);
                            last_event[peer] = Some(seen.at);
                        }
                    }
                }
            }
        }
    }
}
