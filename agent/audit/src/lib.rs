//! The audit records of salt-keysync, without I/O: the [`Record`] the log
//! keeps one JSON line of, what it says as types ([`Action`], [`Outcome`],
//! [`Via`]), and [`record`], what each event of the node machine is
//! recorded as. The agent writes, chains and reads these (`disk/audit`
//! there); the simulation of `keysync-machine` makes them of every event a
//! node tells, so what it checks is what the log says.

mod event;
mod kinds;

use serde::{Deserialize, Serialize};

pub use event::{describe, record, stale, tells};
pub use kinds::{Action, Outcome, Via};

/// One audit record. Field names are part of the user-facing contract.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// RFC 3339, UTC.
    pub time: String,
    /// The node that recorded this line.
    pub node: String,
    /// accept, reject, delete, pending, conflict, refuse, connect, ...
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minion: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Where the decision was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// `local`, or the peer it arrived from.
    pub via: String,
    /// applied, superseded, refused, failed, ...
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// For conflicts and discarded pending keys: the other side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_fingerprint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_version: Option<String>,
    /// The agents a decision passed through before the one it came from
    /// (`via`), origin excluded, as each forwarder reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relays: Option<Vec<String>>,
    /// The peer name a connection presented or was identified as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The remote socket address of a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// Position in the chain: one more than the record before, also across
    /// rotated files. A gap means removed records, a step back reordering.
    #[serde(default)]
    pub seq: u64,
    /// sha256 of the previous line (hex).
    #[serde(default)]
    pub prev: String,
}

impl Record {
    /// A record of `action` from `via` with `outcome`; the writer fills in
    /// `time`, `node`, `seq` and `prev` as it appends it.
    pub fn new(action: Action, via: Via<'_>, outcome: Outcome) -> Record {
        Record {
            action: action.as_str().into(),
            via: via.as_str().into(),
            outcome: outcome.as_str().into(),
            ..Record::default()
        }
    }
}
