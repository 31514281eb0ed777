//! What an audit record says, as types: its `action`, its `outcome` and
//! where the decision came from (`via`). Records are built from these only
//! ([`crate::Record::new`]); the log keeps their names, which are part of
//! the user-facing contract (docs/operations.md lists them).

use keysync_machine::core::VerdictKind;
use keysync_machine::node::OperatorAction;
use keysync_machine::PeerName;

/// Defines an enum whose variants each have one name in the audit log.
macro_rules! names {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every one, in the order the docs list them.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// Its name in the audit log.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

names! {
    /// What a record is about (`salt-keysync audit --action` takes these).
    Action {
        Accept => "accept",
        Reject => "reject",
        Delete => "delete",
        Pending => "pending",
        Conflict => "conflict",
        Refuse => "refuse",
        Connect => "connect",
        Inventory => "inventory",
        Write => "write",
        Rotate => "rotate",
        MasterKey => "master-key",
        Settings => "settings",
        AutoAccept => "auto-accept",
        Reload => "reload",
        Folder => "folder",
        Start => "start",
        Stop => "stop",
        Gap => "gap",
        Lost => "lost",
        Repair => "repair",
        Hold => "hold",
        Release => "release",
        Revert => "revert",
        Mode => "mode",
        Stale => "stale",
        TakeBack => "take-back",
        /// The first record of a file continuing a rotated one's chain.
        Continue => "continue",
    }
}

names! {
    /// What came of it.
    Outcome {
        Applied => "applied",
        Superseded => "superseded",
        Refused => "refused",
        Observed => "observed",
        Discarded => "discarded",
        Resolved => "resolved",
        Failed => "failed",
        Recovered => "recovered",
        Replaced => "replaced",
        Doubted => "doubted",
        Kept => "kept",
        Ruled => "ruled",
        Held => "held",
        Ended => "ended",
        Detected => "detected",
        Unheld => "unheld",
        PutBack => "put-back",
        TakenBack => "taken-back",
        Started => "started",
        Stopped => "stopped",
        Rotated => "rotated",
        Reopened => "reopened",
        Truncated => "truncated",
        Accepted => "accepted",
        Mismatch => "mismatch",
        Drift => "drift",
    }
}

impl Action {
    /// The action of a decision of this kind.
    pub fn of(kind: VerdictKind) -> Action {
        match kind {
            VerdictKind::Accepted => Action::Accept,
            VerdictKind::Rejected => Action::Reject,
            VerdictKind::Deleted => Action::Delete,
        }
    }

    /// The action of an operator's release or revert.
    pub fn operator(action: OperatorAction) -> Action {
        match action {
            OperatorAction::Release => Action::Release,
            OperatorAction::Revert => Action::Revert,
        }
    }
}

/// Where what a record tells came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via<'a> {
    /// This master: its folders, its operator, the agent itself.
    Local,
    /// A decision finished from the journal a stop left.
    Journal,
    /// A connection before (or without) a peer's identity: a stranger.
    Network,
    /// A peer, by the name its certificate proves.
    Peer(&'a PeerName),
}

impl<'a> Via<'a> {
    /// Where a machine event says a decision came from: a peer's name, or
    /// the machine's name for its journal (which no peer may have: the
    /// agent's config refuses the fixed names, [`PeerName::RESERVED`]).
    pub fn from_source(source: &'a PeerName) -> Via<'a> {
        if source.is_journal() {
            Via::Journal
        } else {
            Via::Peer(source)
        }
    }

    /// Its name in the audit log.
    pub fn as_str(self) -> &'a str {
        match self {
            Via::Local => "local",
            Via::Journal => "journal",
            Via::Network => "network",
            Via::Peer(name) => name.as_str(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_the_journal_or_a_peer() {
        assert_eq!(Via::from_source(&PeerName::journal()), Via::Journal);
        let master_b = keysync_machine::testkit::peer("master-b");
        assert_eq!(Via::from_source(&master_b), Via::Peer(&master_b));
    }

    #[test]
    fn names_are_distinct() {
        let actions: std::collections::BTreeSet<&str> = Action::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(actions.len(), Action::ALL.len());
        let outcomes: std::collections::BTreeSet<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(outcomes.len(), Outcome::ALL.len());
    }
}
