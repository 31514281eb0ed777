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
    /// Per name: the changes written and not heard back yet, and when.
    expected: HashMap<String, (Instant, Vec<(Folder, FsChange)>)>,
}

impl Echoes {
    /// The agent has just made `changes` to `name` in the watched folders.
    pub fn expect(&mut self, name: &str, changes: &[(Folder, FsChange)], now: Instant) {
        if changes.is_empty() {
            return;
        }
        let entry = self.expected.entry(name.to_string()).or_insert_with(|| (now, Vec::new()));
        entry.0 = now;
        entry.1.extend_from_slice(changes);
    }

    /// True if this event is the echo of a change the agent made (consumed:
    /// each listed change matches one event). Changes listed longer than
    /// [`ECHO_TTL`] ago match nothing.
    pub fn is_echo(&mut self, folder: Folder, name: &str, change: FsChange, now: Instant) -> bool {
        let Some((listed, changes)) = self.expected.get_mut(name) else { return false };
        if now.duration_since(*listed) >= ECHO_TTL {
            self.expected.remove(name);
            return false;
        }
        let Some(at) = changes.iter().position(|&c| c == (folder, change)) else { return false };
        changes.swap_remove(at);
        if changes.is_empty() {
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
        self.expected.retain(|_, (at, _)| now.duration_since(*at) < ECHO_TTL);
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
}
