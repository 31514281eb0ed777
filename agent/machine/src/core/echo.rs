//! The agent's own writes, heard back through inotify.
//!
//! Applying a peer's decision renames and removes files in the watched
//! folders, and each of those changes comes back as an event. Read back,
//! they only confirm what was just written, at the cost of three opens and a
//! key parse per id: for a 10,000-key `salt-key -A` on another master, most
//! of what a peer would do after writing the keys.
//!
//! So each write lists the changes it made, and an event matching one of
//! them is taken as that change's echo and dropped, each listed change once.
//! This never hides an operator's change: events arrive in the order the
//! changes were made, so if someone else's change to the same name is
//! mistaken for the agent's own, the agent's own event, arriving after it,
//! finds nothing listed any more and the name is read, after both. Should
//! events have been lost (a queue overflow, a failed watch), the folders
//! are rescanned and the list forgotten; a change whose event has not come
//! within [`ECHO_TTL`] is forgotten too.
//!
//! A pending file hard-linked into place is heard as IN_CREATE (`Written`)
//! with no close after it: should that event not be taken as an echo (the
//! list was just forgotten), the settler holds the id for its longest wait,
//! `max_hold`, before reading it. Slower, never wrong.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::observe::Folder;
use super::settle::FsChange;

/// How long a written change waits for its event (normally microseconds).
pub const ECHO_TTL: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub struct Echoes {
    /// Per name: the changes written and not heard back yet, and when. A
    /// joining master writes 100,000 ids faster than their events come back:
    /// tens of thousands are listed at once, so each takes 32 bytes.
    expected: HashMap<Box<str>, Listed>,
    /// What [`Listed::at_ms`] counts from: the first change listed.
    epoch: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Listed {
    /// When the last change was listed, in milliseconds since the epoch.
    at_ms: u64,
    /// How many of each change are listed, four bits for each of the 12
    /// (folder, change) pairs. A name listing one change more than 15 times
    /// at once (it never lists more than 3) keeps 15: the extra events are
    /// read as changes, which is slower, never wrong.
    counts: u64,
}

impl Listed {
    fn shift(folder: Folder, change: FsChange) -> u32 {
        let folder = Folder::ALL.iter().position(|f| *f == folder).expect("Folder::ALL lists every folder") as u32;
        4 * (4 * folder + change as u32)
    }

    fn add(&mut self, folder: Folder, change: FsChange) {
        let shift = Listed::shift(folder, change);
        if (self.counts >> shift) & 0xf < 0xf {
            self.counts += 1 << shift;
        }
    }

    /// Listed [`ECHO_TTL`] or longer before `now_ms`.
    fn expired(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.at_ms) >= ECHO_TTL.as_millis() as u64
    }

    /// Takes one `(folder, change)` off the list, if listed.
    fn take(&mut self, folder: Folder, change: FsChange) -> bool {
        let shift = Listed::shift(folder, change);
        if (self.counts >> shift) & 0xf == 0 {
            return false;
        }
        self.counts -= 1 << shift;
        true
    }
}

impl Echoes {
    fn ms(&mut self, now: Instant) -> u64 {
        let epoch = *self.epoch.get_or_insert(now);
        u64::try_from(now.saturating_duration_since(epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// The agent has just made `changes` to `name` in the watched folders.
    pub fn expect(&mut self, name: &str, changes: &[(Folder, FsChange)], now: Instant) {
        if changes.is_empty() {
            return;
        }
        let at_ms = self.ms(now);
        let listed = match self.expected.get_mut(name) {
            Some(listed) => listed,
            None => self.expected.entry(name.into()).or_insert(Listed { at_ms, counts: 0 }),
        };
        listed.at_ms = at_ms;
        for &(folder, change) in changes {
            listed.add(folder, change);
        }
    }

    /// True if this event is the echo of a change the agent made (consumed:
    /// each listed change matches one event). Changes listed longer than
    /// [`ECHO_TTL`] ago match nothing.
    pub fn is_echo(&mut self, folder: Folder, name: &str, change: FsChange, now: Instant) -> bool {
        let now_ms = self.ms(now);
        let Some(listed) = self.expected.get_mut(name) else { return false };
        if listed.expired(now_ms) {
            self.expected.remove(name);
            return false;
        }
        if !listed.take(folder, change) {
            return false;
        }
        if listed.counts == 0 {
            self.expected.remove(name);
            self.shrink();
        }
        true
    }

    /// Forgets every listed change (events were lost: a rescan follows).
    pub fn clear(&mut self) {
        self.expected = HashMap::new();
    }

    /// Forgets changes listed longer than [`ECHO_TTL`] ago.
    pub fn expire(&mut self, now: Instant) {
        let before = self.expected.len();
        let now_ms = self.ms(now);
        self.expected.retain(|_, listed| !listed.expired(now_ms));
        if self.expected.len() != before {
            self.shrink();
        }
    }

    pub fn len(&self) -> usize {
        self.expected.len()
    }

    pub fn is_empty(&self) -> bool {
        self.expected.is_empty()
    }

    /// A burst's worth of capacity is handed back once it is heard.
    fn shrink(&mut self) {
        if self.expected.capacity() > 4 * self.expected.len() + 1024 {
            self.expected.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADOPTED: [(Folder, FsChange); 2] = [(Folder::Pending, FsChange::Gone), (Folder::Accepted, FsChange::MovedIn)];

    #[test]
    fn each_written_change_swallows_one_event() {
        let mut echoes = Echoes::default();
        let now = Instant::now();
        echoes.expect("web01", &ADOPTED, now);
        assert!(!echoes.is_echo(Folder::Accepted, "web02", FsChange::MovedIn, now), "another name");
        assert!(!echoes.is_echo(Folder::Rejected, "web01", FsChange::MovedIn, now), "another folder");
        assert!(!echoes.is_echo(Folder::Accepted, "web01", FsChange::Gone, now), "another change");
        assert!(echoes.is_echo(Folder::Pending, "web01", FsChange::Gone, now));
        assert!(echoes.is_echo(Folder::Accepted, "web01", FsChange::MovedIn, now));
        assert!(!echoes.is_echo(Folder::Accepted, "web01", FsChange::MovedIn, now), "heard once only");
        assert!(echoes.is_empty());
    }

    #[test]
    fn an_operators_change_mistaken_for_an_echo_leaves_the_agents_own_event_to_be_read() {
        // salt-key moved web01 just before the agent wrote the same change:
        // the operator's events come first and are taken as the echo; the
        // agent's own, after them, are then read like any other.
        let mut echoes = Echoes::default();
        let now = Instant::now();
        echoes.expect("web01", &ADOPTED, now);
        let events = ADOPTED.iter().chain(ADOPTED.iter());
        let heard: Vec<bool> = events.map(|&(folder, change)| echoes.is_echo(folder, "web01", change, now)).collect();
        assert_eq!(heard, [true, true, false, false]);
    }

    #[test]
    fn changes_not_heard_back_are_forgotten() {
        let mut echoes = Echoes::default();
        let now = Instant::now();
        echoes.expect("web01", &ADOPTED, now);
        echoes.expect("web02", &ADOPTED, now + ECHO_TTL / 2);
        // An event heard too late is not taken for an echo, swept or not.
        assert!(!echoes.is_echo(Folder::Pending, "web01", FsChange::Gone, now + ECHO_TTL), "expired");
        echoes.expect("web01", &ADOPTED, now);
        echoes.expire(now + ECHO_TTL);
        assert_eq!(echoes.len(), 1);
        assert!(!echoes.is_echo(Folder::Pending, "web01", FsChange::Gone, now), "swept");
        assert!(echoes.is_echo(Folder::Pending, "web02", FsChange::Gone, now));
        echoes.clear();
        assert!(!echoes.is_echo(Folder::Accepted, "web02", FsChange::MovedIn, now), "cleared");
    }

    #[test]
    fn a_change_listed_twice_swallows_two_events_and_every_pair_is_told_apart() {
        assert_eq!(std::mem::size_of::<Listed>(), 16);
        let mut echoes = Echoes::default();
        let now = Instant::now();
        let changes = [FsChange::Written, FsChange::Closed, FsChange::MovedIn, FsChange::Gone];
        let pairs: Vec<(Folder, FsChange)> = Folder::ALL.iter().flat_map(|&f| changes.map(|c| (f, c))).collect();
        for (n, &pair) in pairs.iter().enumerate() {
            echoes.expect("web01", &vec![pair; n % 3 + 1], now);
        }
        for (n, &(folder, change)) in pairs.iter().enumerate() {
            for _ in 0..n % 3 + 1 {
                assert!(echoes.is_echo(folder, "web01", change, now), "{folder:?} {change:?}");
            }
        }
        assert!(echoes.is_empty(), "each listed change heard exactly as often as listed");
        // Past 15 of one change, the rest are read as changes.
        echoes.expect("web02", &[(Folder::Accepted, FsChange::MovedIn); 20], now);
        let heard = (0..20).filter(|_| echoes.is_echo(Folder::Accepted, "web02", FsChange::MovedIn, now)).count();
        assert_eq!(heard, 15);
    }
}
