//! Turns the stream of file events in the key folders into the moments at
//! which an id's folders can be read and trusted.
//!
//! `salt-key` moves keys in several steps: 3006 renames between folders,
//! 3008 first removes the id from all three folders and then renames a
//! `tmpXXXXXXXX` file over the final name, and the master writes pending keys
//! in place. Reading in the middle would see a key in no folder (a false
//! delete), a temporary file that looks like a minion, or a half-written key.
//! So: a rename into place is final and read at once; a disappearance is read
//! after a grace period, held while a temporary file is being written nearby;
//! a file written in place is read once closed and quiet.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::observe::Folder;

/// The file events the settler needs, as inotify reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsChange {
    /// IN_CREATE or IN_MODIFY: the file is being written.
    Written,
    /// IN_CLOSE_WRITE.
    Closed,
    /// IN_MOVED_TO: a finished file renamed into place.
    MovedIn,
    /// IN_MOVED_FROM or IN_DELETE.
    Gone,
}

#[derive(Clone, Debug)]
pub struct SettleTimings {
    /// How long a disappearance waits for the id to reappear elsewhere.
    pub absent_grace: Duration,
    /// How long a file closed after an in-place write waits for more writes
    /// or a rename away.
    pub write_grace: Duration,
    /// Same for a name shaped like Salt's `tmpXXXXXXXX` temporary files,
    /// which are renamed away right after being written.
    pub tmp_grace: Duration,
    /// Longest wait in any case (a writer that never closes, a temporary
    /// file left behind by a crashed salt-key).
    pub max_hold: Duration,
}

impl Default for SettleTimings {
    fn default() -> Self {
        SettleTimings {
            absent_grace: Duration::from_millis(40),
            write_grace: Duration::from_millis(50),
            tmp_grace: Duration::from_millis(1500),
            max_hold: Duration::from_secs(5),
        }
    }
}

#[derive(Debug)]
struct Unsettled {
    due: Instant,
    /// When the wait began, which bounds it (`max_hold`): the first event,
    /// or the latest disappearance of a name seen only disappearing. A
    /// name held since a recheck (lost events, a start) that a salt-key
    /// run then removes is read after that run's rename, not cut short
    /// by the cap of the earlier wait: read in between, it was in no
    /// folder (a false delete).
    since: Instant,
    /// Open for writing somewhere (between IN_CREATE/IN_MODIFY and IN_CLOSE_WRITE).
    writing: HashSet<Folder>,
    /// Only disappearances so far: held while a temporary file is in flight.
    absent_only: bool,
}

/// Collects events per name and says which names are ready to be read.
#[derive(Debug, Default)]
pub struct Settler {
    timings: SettleTimings,
    unsettled: HashMap<String, Unsettled>,
    /// `tmpXXXXXXXX` files created and not yet gone: a 3008 salt-key is mid-way.
    tmp_in_flight: HashSet<(Folder, String)>,
    /// Since a recheck (events lost, or not heard before a start-up) and
    /// until it settles, every name counts as unsettled, as a disappearance
    /// does: a salt-key run whose removal of an id was among the events
    /// lost may be working on an id that no folder lists and the node does
    /// not hold (a pending key). Nothing names that id to the recheck, yet
    /// a peer's decision for it must not be written mid-run.
    unheard: Option<Unsettled>,
}

/// Salt 3008 writes keys through `tempfile.mkstemp(dir=folder)`: "tmp" and
/// eight characters from `[a-z0-9_]`.
pub fn looks_like_salt_tmp(name: &str) -> bool {
    name.len() == 11
        && name.starts_with("tmp")
        && name[3..].bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl Settler {
    pub fn new(timings: SettleTimings) -> Settler {
        Settler { timings, ..Settler::default() }
    }

    pub fn on_event(&mut self, folder: Folder, name: &str, change: FsChange, now: Instant) {
        // Dot files are ignored by Salt and used by the agent for staging.
        if name.starts_with('.') {
            return;
        }
        let tmp = looks_like_salt_tmp(name);
        match change {
            FsChange::Written if tmp => {
                self.tmp_in_flight.insert((folder, name.to_string()));
            }
            FsChange::Gone | FsChange::MovedIn if tmp => {
                self.tmp_in_flight.remove(&(folder, name.to_string()));
            }
            _ => {}
        }
        let timings = &self.timings;
        let entry = self.unsettled.entry(name.to_string()).or_insert_with(|| Unsettled {
            due: now,
            since: now,
            writing: HashSet::new(),
            absent_only: true,
        });
        let write_grace = if tmp { timings.tmp_grace } else { timings.write_grace };
        match change {
            FsChange::Written => {
                entry.writing.insert(folder);
                entry.absent_only = false;
                entry.due = now + write_grace;
            }
            FsChange::Closed => {
                entry.writing.remove(&folder);
                entry.absent_only = false;
                entry.due = now + write_grace;
            }
            FsChange::MovedIn => {
                entry.writing.remove(&folder);
                entry.absent_only = false;
                entry.due = now;
            }
            FsChange::Gone => {
                entry.writing.remove(&folder);
                if entry.absent_only {
                    entry.since = now;
                }
                entry.due = entry.due.max(now + timings.absent_grace);
            }
        }
    }

    /// Events were lost (an inotify overflow), or nothing was heard yet (a
    /// start-up): every name in `recheck` is read only once it has settled,
    /// as after a disappearance, and held while a salt-key run is seen in
    /// progress: each `tmpXXXXXXXX` file `listed` counts as one in flight
    /// (its events may be among those lost). Reading at once could catch a
    /// Salt 3008 run between removing an id from every folder and renaming
    /// its key into place: a false delete. Until the recheck has settled,
    /// every other name counts as unsettled too ([`Settler::is_unsettled`]):
    /// the run may be on an id nothing named here.
    pub fn recheck<'a>(
        &mut self,
        listed: &[(Folder, String)],
        recheck: impl IntoIterator<Item = &'a str>,
        now: Instant,
    ) {
        self.note_listed(listed, now);
        let unheard = self.unheard.get_or_insert_with(|| Unsettled {
            due: now,
            since: now,
            writing: HashSet::new(),
            absent_only: true,
        });
        unheard.due = unheard.due.max(now + self.timings.absent_grace);
        for name in recheck {
            if !name.starts_with('.') && !looks_like_salt_tmp(name) {
                // No folder: only its disappearance grace and the tmp files matter.
                let entry = self.unsettled.entry(name.to_string()).or_insert_with(|| Unsettled {
                    due: now,
                    since: now,
                    writing: HashSet::new(),
                    absent_only: true,
                });
                entry.due = entry.due.max(now + self.timings.absent_grace);
            }
        }
    }

    /// A listing of the folders: each `tmpXXXXXXXX` file in it counts as a
    /// salt-key run in flight, and no other (their events may have been
    /// lost, or not heard before a start-up).
    pub fn note_listed(&mut self, listed: &[(Folder, String)], now: Instant) {
        // The listing is what the folders hold now: a temporary file that is
        // not in it is gone, its disappearance perhaps among the events lost.
        // Kept in flight, it would hold every disappearance until `max_hold`.
        let listed_tmp: HashSet<(Folder, &str)> = listed
            .iter()
            .filter(|(_, name)| looks_like_salt_tmp(name))
            .map(|(folder, name)| (*folder, name.as_str()))
            .collect();
        self.tmp_in_flight.retain(|(folder, name)| listed_tmp.contains(&(*folder, name.as_str())));
        for (folder, name) in listed.iter().filter(|(_, name)| looks_like_salt_tmp(name)) {
            self.on_event(*folder, name, FsChange::Written, now);
        }
    }

    /// Whether a salt-key run (a `tmpXXXXXXXX` file) is known to be in progress.
    pub fn tmp_in_flight(&self) -> bool {
        !self.tmp_in_flight.is_empty()
    }

    /// When the next name may become ready, for the driver's timer.
    pub fn next_due(&self) -> Option<Instant> {
        self.unsettled.values().chain(&self.unheard).map(|u| self.effective_due(u)).min()
    }

    fn effective_due(&self, unsettled: &Unsettled) -> Instant {
        let cap = unsettled.since + self.timings.max_hold;
        let held = !unsettled.writing.is_empty() || (unsettled.absent_only && !self.tmp_in_flight.is_empty());
        if held {
            cap
        } else {
            unsettled.due.min(cap)
        }
    }

    /// Takes the names whose folders can be read now.
    pub fn take_due(&mut self, now: Instant) -> Vec<String> {
        let mut due: Vec<String> =
            self.unsettled.iter().filter(|(_, u)| self.effective_due(u) <= now).map(|(name, _)| name.clone()).collect();
        for name in &due {
            self.unsettled.remove(name);
        }
        if self.unheard.as_ref().is_some_and(|u| self.effective_due(u) <= now) {
            // Nothing of its own to read: the names it stood for are read
            // as their own events or the recheck's names settle.
            self.unheard = None;
        }
        if self.is_idle() {
            // A temporary file that was never seen going must not hold
            // future deletes back forever.
            self.tmp_in_flight.clear();
            // A burst (a join's echo, salt-key -A) grew the maps: hand the
            // memory back rather than keep it for the next one.
            self.unsettled.shrink_to_fit();
            self.tmp_in_flight.shrink_to_fit();
        }
        due.sort();
        due
    }

    /// Whether events for `name` are still being collected (a rescan leaves
    /// it alone, a peer's decision for it waits), or a recheck has not
    /// settled yet, which holds every name.
    pub fn is_unsettled(&self, name: &str) -> bool {
        self.unheard.is_some() || self.unsettled.contains_key(name)
    }

    pub fn is_idle(&self) -> bool {
        self.unsettled.is_empty() && self.unheard.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Folder::*;
    use FsChange::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Feeds `(offset ms, folder, name, change)` events, then reports which
    /// names were taken when, polling every millisecond up to `until_ms`.
    fn check(events: &[(u64, Folder, &str, FsChange)], until_ms: u64) -> Vec<(u64, String)> {
        let start = Instant::now();
        let mut settler = Settler::new(SettleTimings::default());
        let mut taken = Vec::new();
        let mut events = events.iter().peekable();
        for t in 0..=until_ms {
            while let Some((at, folder, name, change)) = events.peek() {
                if *at != t {
                    break;
                }
                settler.on_event(*folder, name, *change, start + ms(t));
                events.next();
            }
            for name in settler.take_due(start + ms(t)) {
                taken.push((t, name));
            }
        }
        taken
    }

    #[test]
    fn salt_3006_accept_is_read_at_the_rename() {
        let taken = check(&[(10, Pending, "web01", Gone), (10, Accepted, "web01", MovedIn)], 200);
        assert_eq!(taken, vec![(10, "web01".to_string())]);
    }

    #[test]
    fn salt_3008_accept_waits_for_the_final_rename_and_ignores_the_tmp_file() {
        let taken = check(
            &[
                (0, Pending, "web01", Gone),
                (1, Accepted, "tmpab_9xyz1", Written),
                (30, Accepted, "tmpab_9xyz1", Written),
                (31, Accepted, "tmpab_9xyz1", Closed),
                (90, Accepted, "tmpab_9xyz1", Gone),
                (90, Accepted, "web01", MovedIn),
            ],
            3000,
        );
        // web01 is held past the absent grace while the tmp file is open, then read at the
        // rename; the tmp name is read long after it vanished (and found absent).
        assert_eq!(taken[0], (90, "web01".to_string()));
        assert_eq!(taken.len(), 2);
        assert_eq!(taken[1].1, "tmpab_9xyz1");
    }

    #[test]
    fn delete_is_read_after_the_grace() {
        let taken = check(&[(5, Accepted, "web01", Gone)], 200);
        assert_eq!(taken, vec![(45, "web01".to_string())]);
    }

    #[test]
    fn in_place_write_is_read_once_closed_and_quiet() {
        let taken = check(
            &[(0, Pending, "web01", Written), (20, Pending, "web01", Written), (100, Pending, "web01", Closed)],
            400,
        );
        assert_eq!(taken, vec![(150, "web01".to_string())]);
    }

    #[test]
    fn a_writer_that_never_closes_is_read_at_the_cap() {
        let taken = check(&[(0, Accepted, "web01", Written)], 6000);
        assert_eq!(taken, vec![(5000, "web01".to_string())]);
    }

    #[test]
    fn agent_staging_files_are_ignored() {
        assert!(check(&[(0, Accepted, ".web01.keysync", Written)], 100).is_empty());
    }

    /// After lost events an id nothing named (a pending key whose removal
    /// was lost) counts as unsettled until the recheck has settled: after
    /// the disappearance grace, or once the salt-key run seen meanwhile is
    /// over.
    #[test]
    fn a_recheck_holds_every_name_until_it_settles() {
        let start = Instant::now();
        let at = |t: u64| start + ms(t);
        let mut quiet = Settler::new(SettleTimings::default());
        quiet.recheck(&[], std::iter::empty(), at(0));
        assert!(quiet.is_unsettled("web01") && !quiet.is_idle());
        assert_eq!(quiet.next_due(), Some(at(40)));
        assert!(quiet.take_due(at(39)).is_empty() && quiet.is_unsettled("web01"));
        assert!(quiet.take_due(at(40)).is_empty(), "nothing of its own to read");
        assert!(!quiet.is_unsettled("web01") && quiet.is_idle());

        let mut run = Settler::new(SettleTimings::default());
        run.recheck(&[], std::iter::empty(), at(0));
        run.on_event(Accepted, "tmpq0x8lbn2", Written, at(1));
        run.on_event(Accepted, "tmpq0x8lbn2", Closed, at(300));
        assert!(run.take_due(at(600)).is_empty() && run.is_unsettled("web01"), "the run is in flight");
        run.on_event(Accepted, "tmpq0x8lbn2", Gone, at(601));
        run.on_event(Accepted, "web01", MovedIn, at(601));
        assert_eq!(run.take_due(at(601)), ["web01"]);
        assert!(!run.is_unsettled("web02"));
    }

    #[test]
    fn recognises_salt_tmp_names() {
        assert!(looks_like_salt_tmp("tmpk2_0az9q"));
        assert!(!looks_like_salt_tmp("tmpk2_0az9"));
        assert!(!looks_like_salt_tmp("web01"));
        assert!(!looks_like_salt_tmp("tmpK2_0AZ9Q"));
    }
}
