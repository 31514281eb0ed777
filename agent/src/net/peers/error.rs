//! Why a link's session ended (see `peers.rs`): told in the log and by
//! `status`, and deciding how long the link waits before the next.

use std::time::Duration;

use keysync_proto::MIN_PROTOCOL_VERSION;

#[derive(Debug, thiserror::Error)]
pub(super) enum SessionError {
    #[error(transparent)]
    Connect(#[from] keysync_server::ConnectError),
    #[error(transparent)]
    Rpc(#[from] tonic::Status),
    #[error("peer answered Hello as {0:?}")]
    WrongName(String),
    #[error("peer speaks protocol {0}, this agent needs {MIN_PROTOCOL_VERSION} or later: upgrade salt-keysync there")]
    OldProtocol(u32),
    #[error("peer closed the push stream")]
    PushClosed,
    #[error(transparent)]
    CoreGone(#[from] crate::node::CoreGone),
    #[error(transparent)]
    Fault(#[from] keysync_machine::link::Fault),
    #[error("refused the peer's Fetch answer: {0}")]
    BadFetch(String),
    #[error("refused the peer's Diff answer: {0}")]
    BadDiff(String),
    #[error("the peer's answer to {call} timed out: {what}")]
    TimedOut { call: &'static str, what: String },
    #[error("the peer's push stream timed out: no batch taken for {} s", .0.as_secs())]
    PushTimedOut(Duration),
}

impl SessionError {
    /// The peer's answer to a round's call, or its push stream, timed out.
    pub(super) fn timed_out(&self) -> bool {
        matches!(self, SessionError::TimedOut { .. } | SessionError::PushTimedOut(_))
    }
}
