//! Every name a scan of the folders reads: the files listed, and the ids
//! held that no folder lists (their files are gone), each once, in order.
//!
//! Kept as the listing itself, sorted, and the few ids it lacks: a merged
//! list of names would copy every one of them (at 1,000,000 keys, the
//! periodic rescan held 120 MiB more than the agent's resident memory, one
//! copy of each listed name and one of each id held, before their dedup).

use crate::core::{Folder, MinionId};

/// The folders' listing sorted by name, and the held ids it lacks.
#[derive(Debug, Default)]
pub(in crate::node) struct Names {
    /// Every file in the three folders, sorted by name (a name in several
    /// folders is there once per folder, side by side).
    pub(in crate::node) listed: Vec<(Folder, String)>,
    /// Ids held that no folder lists, sorted.
    unlisted: Vec<MinionId>,
}

impl Names {
    /// `listed`, the folders' listing in any order, and the ids held.
    pub(in crate::node) fn new<'a>(
        mut listed: Vec<(Folder, String)>,
        held: impl Iterator<Item = &'a MinionId>,
    ) -> Names {
        listed.sort_unstable_by(|(_, a), (_, b)| a.cmp(b));
        let is_listed = |id: &MinionId| listed.binary_search_by(|(_, name)| name.as_str().cmp(id.as_str())).is_ok();
        let mut unlisted: Vec<MinionId> = held.filter(|id| !is_listed(id)).cloned().collect();
        unlisted.sort_unstable();
        Names { listed, unlisted }
    }

    /// Whether the folders list `name`.
    pub(in crate::node) fn is_listed(&self, name: &str) -> bool {
        self.listed.binary_search_by(|(_, listed)| listed.as_str().cmp(name)).is_ok()
    }

    /// Every name, once each, sorted.
    pub(in crate::node) fn iter(&self) -> impl Iterator<Item = &str> {
        let mut at = Cursor::default();
        std::iter::from_fn(move || self.next_at(&mut at))
    }

    /// The name at `at`, which then moves past it: [`Names::iter`] a step
    /// at a time, for a scan spread over several turns.
    pub(in crate::node) fn next_at(&self, at: &mut Cursor) -> Option<&str> {
        let listed = self.listed.get(at.listed).map(|(_, name)| name.as_str());
        let unlisted = self.unlisted.get(at.unlisted).map(MinionId::as_str);
        match (listed, unlisted) {
            (Some(x), Some(y)) if y < x => {
                at.unlisted += 1;
                Some(y)
            }
            (Some(x), _) => {
                // Once, though it may be in several folders.
                while self.listed.get(at.listed).is_some_and(|(_, name)| name == x) {
                    at.listed += 1;
                }
                Some(x)
            }
            (None, y) => {
                at.unlisted += usize::from(y.is_some());
                y
            }
        }
    }

    /// How many names [`Names::iter`] gives.
    pub(in crate::node) fn len(&self) -> usize {
        self.iter().count()
    }

    /// Every name, once each, sorted, owned: each listed name is moved out
    /// of the listing, not copied, and dropped by the caller once read.
    pub(in crate::node) fn into_names(self) -> impl Iterator<Item = String> {
        let listed = self.listed.into_iter().map(|(_, name)| name);
        let unlisted = self.unlisted.into_iter().map(|id| id.as_str().to_string());
        merged(listed, unlisted)
    }
}

/// How far a scan through [`Names`] got.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::node) struct Cursor {
    listed: usize,
    unlisted: usize,
}

/// Two sorted sequences as one, sorted, each name once: `a` may hold a name
/// several times in a row, `b` holds none of `a`'s.
fn merged<T: AsRef<str>>(a: impl Iterator<Item = T>, b: impl Iterator<Item = T>) -> impl Iterator<Item = T> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || {
        let from_b = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => y.as_ref() < x.as_ref(),
            (Some(_), None) => false,
            (None, _) => true,
        };
        if from_b {
            return b.next();
        }
        let next = a.next()?;
        while a.peek().is_some_and(|same| same.as_ref() == next.as_ref()) {
            a.next();
        }
        Some(next)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> MinionId {
        MinionId::parse(name).unwrap()
    }

    #[test]
    fn every_name_once_sorted_listed_or_held() {
        let listed = vec![
            (Folder::Rejected, "web03".to_string()),
            (Folder::Accepted, "web01".to_string()),
            (Folder::Pending, "web03".to_string()),
            (Folder::Pending, "db01".to_string()),
        ];
        let held = [id("web01"), id("gone02"), id("web03"), id("zz-gone")];
        let names = Names::new(listed, held.iter());
        let want = ["db01", "gone02", "web01", "web03", "zz-gone"];
        assert_eq!(names.iter().collect::<Vec<_>>(), want);
        assert_eq!(names.len(), want.len());
        let (mut at, mut stepped) = (Cursor::default(), Vec::new());
        while let Some(name) = names.next_at(&mut at) {
            stepped.push(name);
        }
        assert_eq!(stepped, want, "a step at a time");
        assert!(names.is_listed("web03") && names.is_listed("db01"));
        assert!(!names.is_listed("gone02"), "held, in no folder");
        assert_eq!(names.into_names().collect::<Vec<_>>(), want);
    }

    #[test]
    fn nothing_listed_nor_held_is_no_name() {
        let names = Names::new(Vec::new(), std::iter::empty());
        assert_eq!(names.iter().count(), 0);
        assert_eq!(names.into_names().count(), 0);
    }
}
