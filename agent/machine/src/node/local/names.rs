//! Every name a scan of the folders reads: the files listed, and the ids
//! held that no folder lists (their files are gone), each once, in order.
//!
//! Kept as the listing itself, sorted, and the few ids it lacks: a merged
//! list of names would copy every one of them (at 1,000,000 keys, the
//! periodic rescan held 120 MiB more than the agent's resident memory, one
//! copy of each listed name and one of each id held, before their dedup).

use crate::core::{Folder, MinionId};
use crate::node::Listing;

/// The folders' listing sorted by name, and the held ids it lacks.
#[derive(Debug, Default)]
pub(in crate::node) struct Names {
    /// Every file in the three folders, sorted by name (a name in several
    /// folders is there once per folder, side by side).
    pub(in crate::node) listed: Vec<(Folder, String)>,
    /// Ids held that no folder lists, sorted.
    unlisted: Vec<MinionId>,
    /// Every folder was listed; when one was not (refused), each name is
    /// placed in all three: nothing says it is not in that one.
    complete: bool,
}

impl Names {
    /// `listed`, the folders' listing in any order, and the ids held.
    pub(in crate::node) fn new<'a>(listing: Listing, held: impl Iterator<Item = &'a MinionId>) -> Names {
        let Listing { files: mut listed, complete } = listing;
        listed.sort_unstable_by(|(_, a), (_, b)| a.cmp(b));
        let is_listed = |id: &MinionId| listed.binary_search_by(|(_, name)| name.as_str().cmp(id.as_str())).is_ok();
        let mut unlisted: Vec<MinionId> = held.filter(|id| !is_listed(id)).cloned().collect();
        unlisted.sort_unstable();
        Names { listed, unlisted, complete }
    }

    /// Every name, once each, sorted.
    pub(in crate::node) fn iter(&self) -> impl Iterator<Item = &str> {
        self.iter_placed().map(|(name, _)| name)
    }

    /// [`Names::iter`], each name with the folders that list it (none: an
    /// id held in no folder).
    pub(in crate::node) fn iter_placed(&self) -> impl Iterator<Item = (&str, InFolders)> {
        let mut at = Cursor::default();
        std::iter::from_fn(move || self.next_at(&mut at))
    }

    /// The name at `at` and the folders that list it; `at` then moves past
    /// it: [`Names::iter_placed`] a step at a time, for a scan spread over
    /// several turns.
    pub(in crate::node) fn next_at(&self, at: &mut Cursor) -> Option<(&str, InFolders)> {
        self.next(at).map(|pick| (self.name(pick), pick.folders()))
    }

    /// How many names [`Names::iter`] gives.
    pub(in crate::node) fn len(&self) -> usize {
        self.iter().count()
    }

    /// [`Names::iter_placed`], owned: each listed name is moved out of the
    /// listing, not copied.
    pub(in crate::node) fn into_placed(mut self) -> impl Iterator<Item = (String, InFolders)> {
        let mut at = Cursor::default();
        std::iter::from_fn(move || {
            // Taken once `next` has passed it: later steps compare later names only.
            self.next(&mut at).map(|pick| match pick {
                Pick::Listed(i, folders) => (std::mem::take(&mut self.listed[i].1), folders),
                Pick::Unlisted(i) => (self.unlisted[i].as_str().to_string(), InFolders::NONE),
            })
        })
    }

    /// The next name from `at` (the first of a name's folders), and moves past it.
    fn next(&self, at: &mut Cursor) -> Option<Pick> {
        let listed = self.listed.get(at.listed).map(|(_, name)| name.as_str());
        let unlisted = self.unlisted.get(at.unlisted).map(MinionId::as_str);
        match (listed, unlisted) {
            (Some(x), Some(y)) if y < x => {
                at.unlisted += 1;
                Some(Pick::Unlisted(at.unlisted - 1))
            }
            (Some(x), _) => {
                let first = at.listed;
                let mut folders = InFolders::NONE;
                // Once, though it may be in several folders.
                while let Some((folder, _)) = self.listed.get(at.listed).filter(|(_, name)| name == x) {
                    folders = folders.with(*folder);
                    at.listed += 1;
                }
                Some(Pick::Listed(first, if self.complete { folders } else { InFolders::ALL }))
            }
            (None, Some(_)) => {
                at.unlisted += 1;
                Some(Pick::Unlisted(at.unlisted - 1))
            }
            (None, None) => None,
        }
    }

    fn name(&self, pick: Pick) -> &str {
        match pick {
            Pick::Listed(i, _) => &self.listed[i].1,
            Pick::Unlisted(i) => self.unlisted[i].as_str(),
        }
    }
}

/// How far a scan through [`Names`] got.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::node) struct Cursor {
    listed: usize,
    unlisted: usize,
}

/// One name of [`Names`]: its first place in the listing and the folders
/// listing it, or its place among the ids held in no folder.
#[derive(Clone, Copy, Debug)]
enum Pick {
    Listed(usize, InFolders),
    Unlisted(usize),
}

impl Pick {
    fn folders(self) -> InFolders {
        match self {
            Pick::Listed(_, folders) => folders,
            Pick::Unlisted(_) => InFolders::NONE,
        }
    }
}

/// The folders a listing named a file in: where a scan reads a name
/// ([`Node::read_listed`](crate::node::Node)); none for an id held in no folder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::node) struct InFolders(u8);

impl InFolders {
    pub(in crate::node) const NONE: InFolders = InFolders(0);
    pub(in crate::node) const ALL: InFolders = InFolders(7);

    fn bit(folder: Folder) -> u8 {
        match folder {
            Folder::Accepted => 1,
            Folder::Pending => 2,
            Folder::Rejected => 4,
        }
    }

    pub(in crate::node) fn with(self, folder: Folder) -> InFolders {
        InFolders(self.0 | InFolders::bit(folder))
    }

    pub(in crate::node) fn contains(self, folder: Folder) -> bool {
        self.0 & InFolders::bit(folder) != 0
    }

    pub(in crate::node) fn is_empty(self) -> bool {
        self.0 == 0
    }
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
        let names = Names::new(Listing { files: listed, complete: true }, held.iter());
        let want = ["db01", "gone02", "web01", "web03", "zz-gone"];
        assert_eq!(names.iter().collect::<Vec<_>>(), want);
        assert_eq!(names.len(), want.len());
        let (mut at, mut stepped) = (Cursor::default(), Vec::new());
        while let Some((name, _)) = names.next_at(&mut at) {
            stepped.push(name);
        }
        assert_eq!(stepped, want, "a step at a time");
        let folders = |name: &str| names.iter_placed().find(|(n, _)| *n == name).map(|(_, f)| f).unwrap();
        assert_eq!(folders("web03"), InFolders::NONE.with(Folder::Pending).with(Folder::Rejected));
        assert_eq!(folders("db01"), InFolders::NONE.with(Folder::Pending));
        assert_eq!(folders("web01"), InFolders::NONE.with(Folder::Accepted));
        assert!(folders("gone02").is_empty(), "held, in no folder");
        assert!(!folders("web03").contains(Folder::Accepted) && folders("web03").contains(Folder::Rejected));
        let placed: Vec<(String, InFolders)> = names.iter_placed().map(|(n, l)| (n.to_string(), l)).collect();
        assert_eq!(names.into_placed().collect::<Vec<_>>(), placed, "owned, the same");
        assert_eq!(placed.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), want);
    }

    #[test]
    fn a_listing_that_left_a_folder_out_places_every_name_in_all_three() {
        let listed = vec![(Folder::Accepted, "web01".to_string())];
        let names = Names::new(Listing { files: listed, complete: false }, [id("gone02")].iter());
        let placed: Vec<(&str, InFolders)> = names.iter_placed().collect();
        assert_eq!(placed, [("gone02", InFolders::NONE), ("web01", InFolders::ALL)]);
    }

    #[test]
    fn nothing_listed_nor_held_is_no_name() {
        let names = Names::new(Listing::default(), std::iter::empty());
        assert_eq!(names.iter().count(), 0);
        assert_eq!(names.into_placed().count(), 0);
    }
}
