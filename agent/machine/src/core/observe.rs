//! What the three key folders say about one minion id, read after its
//! changes have settled.

use super::decision::{PublicKey, Verdict};
use super::keyfile::KeyError;

/// The Salt key folders the agent watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Folder {
    Accepted,
    Pending,
    Rejected,
}

impl Folder {
    pub const ALL: [Folder; 3] = [Folder::Accepted, Folder::Pending, Folder::Rejected];

    /// Its place in [`Folder::ALL`].
    pub fn index(self) -> usize {
        match self {
            Folder::Accepted => 0,
            Folder::Pending => 1,
            Folder::Rejected => 2,
        }
    }

    /// The folder's name under pki_dir.
    pub fn dir_name(self) -> &'static str {
        match self {
            Folder::Accepted => "minions",
            Folder::Pending => "minions_pre",
            Folder::Rejected => "minions_rejected",
        }
    }
}

/// One folder's file for one id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slot {
    Absent,
    Key(PublicKey),
    /// Present but refused: not a regular file, or not a single public key.
    Refused(Refusal),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not a regular file ({0})")]
    NotRegular(&'static str),
    #[error("a hard link with {0} names (could be another key file)")]
    HardLinked(u64),
    #[error(transparent)]
    Content(#[from] KeyError),
    #[error("cannot read: {0}")]
    Unreadable(String),
}

/// A key file as the runtime read it: its folder, and its inode, size,
/// owner, mode and change time hashed (the agent's `disk/pki/token.rs`).
/// A scan that read an id's one file in `minions/` or `minions_rejected/`
/// and decided nothing keeps it with the id's entry, and the next scan
/// reads that file again only if [`Runtime::unchanged`] says it is not the
/// same file any more: every key file was read at every periodic rescan
/// (56 s at 1,000,000 keys every 5 minutes) and again after lost events.
/// Forgotten whenever the entry changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileToken(std::num::NonZeroU64);

impl FileToken {
    /// The token of a file in `folder` whose identity hashes to `identity`.
    pub fn new(folder: Folder, identity: u64) -> FileToken {
        let folder = match folder {
            Folder::Accepted => 1,
            Folder::Pending => 2,
            Folder::Rejected => 3,
        };
        FileToken(std::num::NonZeroU64::new((identity & !3) | folder).expect("the folder's bits are not zero"))
    }

    /// The folder of the file.
    pub fn folder(self) -> Folder {
        match self.0.get() & 3 {
            1 => Folder::Accepted,
            2 => Folder::Pending,
            _ => Folder::Rejected,
        }
    }
}

/// The three folders' files for one id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slots {
    pub accepted: Slot,
    pub pending: Slot,
    pub rejected: Slot,
}

impl Slots {
    pub const EMPTY: Slots = Slots { accepted: Slot::Absent, pending: Slot::Absent, rejected: Slot::Absent };

    /// Each folder's slot as `read` gives it, in the order of [`Folder::ALL`].
    pub fn read(mut read: impl FnMut(Folder) -> Slot) -> Slots {
        Slots { accepted: read(Folder::Accepted), pending: read(Folder::Pending), rejected: read(Folder::Rejected) }
    }

    pub fn get(&self, folder: Folder) -> &Slot {
        match folder {
            Folder::Accepted => &self.accepted,
            Folder::Pending => &self.pending,
            Folder::Rejected => &self.rejected,
        }
    }

    /// The token of these slots' one key file ([`FileToken`], as `token`
    /// gives a folder's), when it is their only file and in `minions/` or
    /// `minions_rejected/`: what a scan keeps with the id's entry.
    pub fn only_key(&self, token: impl Fn(Folder) -> Option<FileToken>) -> Option<FileToken> {
        let mut present = Folder::ALL.into_iter().filter(|&folder| !matches!(self.get(folder), Slot::Absent));
        let (Some(folder), None) = (present.next(), present.next()) else { return None };
        match self.get(folder) {
            Slot::Key(_) if folder != Folder::Pending => token(folder),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, folder: Folder) -> &mut Slot {
        match folder {
            Folder::Accepted => &mut self.accepted,
            Folder::Pending => &mut self.pending,
            Folder::Rejected => &mut self.rejected,
        }
    }
}

/// The decision-relevant reading of [`Slots`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Accepted or rejected: a decision an operator made.
    Decided(Verdict),
    /// In no folder, or only pending: no decision (a tombstone if one was held).
    Undecided,
    /// A refused file where the decision would be: no conclusion can be drawn,
    /// the held decision stands.
    Unknown,
}

/// Reads slots the way Salt does: a rejected key wins over everything
/// (both 3006 and 3008 check `minions_rejected` first), then an accepted one.
pub fn interpret(slots: &Slots) -> Reading {
    match &slots.rejected {
        Slot::Key(key) => return Reading::Decided(Verdict::Rejected(key.clone())),
        Slot::Refused(_) => return Reading::Unknown,
        Slot::Absent => {}
    }
    match &slots.accepted {
        Slot::Key(key) => Reading::Decided(Verdict::Accepted(key.clone())),
        Slot::Refused(_) => Reading::Unknown,
        Slot::Absent => Reading::Undecided,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::PUB;

    fn key() -> Slot {
        Slot::Key(PublicKey::new(PUB.as_bytes()))
    }

    fn refused() -> Slot {
        Slot::Refused(Refusal::Content(KeyError::PrivateKey))
    }

    #[test]
    fn interprets_like_salt() {
        let k = PublicKey::new(PUB.as_bytes());
        let cases = [
            (Slots::EMPTY, Reading::Undecided),
            (Slots { pending: key(), ..Slots::EMPTY }, Reading::Undecided),
            (Slots { pending: refused(), ..Slots::EMPTY }, Reading::Undecided),
            (Slots { accepted: key(), ..Slots::EMPTY }, Reading::Decided(Verdict::Accepted(k.clone()))),
            (Slots { rejected: key(), ..Slots::EMPTY }, Reading::Decided(Verdict::Rejected(k.clone()))),
            (
                Slots { accepted: key(), rejected: key(), pending: key() },
                Reading::Decided(Verdict::Rejected(k.clone())),
            ),
            (Slots { accepted: key(), pending: key(), ..Slots::EMPTY }, Reading::Decided(Verdict::Accepted(k))),
            (Slots { accepted: refused(), ..Slots::EMPTY }, Reading::Unknown),
            (Slots { accepted: key(), rejected: refused(), ..Slots::EMPTY }, Reading::Unknown),
        ];
        for (slots, want) in cases {
            assert_eq!(interpret(&slots), want, "{slots:?}");
        }
    }
}
