//! Held deletes over the control socket: what the blast-radius guard holds
//! here (`held`, and a summary per origin for `status`), and an operator's
//! `release` or `revert`, naming who asked (the socket peer's user) in the
//! audit log. Owner-only like every request on the socket.

use serde::{Deserialize, Serialize};

use keysync_machine::node::{HeldDelete, OperatorAction};

use crate::core::MinionId;
use crate::node::{CoreGone, CoreHandle, Request};

/// Ids listed per origin in a summary.
const FIRST_IDS: usize = 5;

/// One held delete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldEntry {
    pub minion: String,
    /// The master where the delete was made.
    pub origin: String,
    /// The peer it came from.
    pub via: String,
    /// When it was held here (RFC 3339).
    pub since: String,
    pub version: String,
}

/// What is held from one origin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldBurst {
    pub origin: String,
    pub count: usize,
    /// When the first of them was held (RFC 3339).
    pub since: String,
    /// The first ids, by name.
    pub first: Vec<String>,
}

/// How many deletes made on `origin` a master's guard holds: what each
/// agent tells its peers in every `Hello`, and they show in `status`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HeldCount {
    pub origin: String,
    pub count: usize,
}

/// A peer that says its guard holds deletes made on this master.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldByPeer {
    pub peer: String,
    pub count: usize,
}

/// What the guard holds, counted per origin (origins by name).
pub fn counts(held: &[HeldDelete]) -> Vec<HeldCount> {
    let mut by_origin: std::collections::BTreeMap<&str, usize> = Default::default();
    for h in held {
        *by_origin.entry(h.origin()).or_default() += 1;
    }
    by_origin.into_iter().map(|(origin, count)| HeldCount { origin: origin.to_string(), count }).collect()
}

/// What the guard of the agent of `core` holds per origin, for a `Hello`.
pub async fn held_counts(core: &CoreHandle) -> Result<Vec<HeldCount>, CoreGone> {
    Ok(counts(&core.ask(|reply| Request::Held { reply }).await?))
}

/// The answer to `held`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldList {
    pub node: String,
    pub bursts: Vec<HeldBurst>,
    pub held: Vec<HeldEntry>,
}

/// What `release` and `revert` send after their word.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorRequest {
    #[serde(default)]
    pub origin: Option<String>,
    #[serde(default)]
    pub ids: Vec<String>,
}

/// The answer to `release` and `revert`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorReply {
    pub action: String,
    /// Applied here and sent to every peer.
    pub done: Vec<String>,
    /// Writes fail here: retried until they succeed.
    pub retrying: Vec<String>,
    /// A salt-key run is working on them here, or their files changed and
    /// the change is not recorded yet: still held.
    pub skipped: Vec<String>,
    #[serde(default)]
    pub error: Option<String>,
}

fn rfc3339(ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| "?".into())
}

/// What is held, per origin (origins by name, ids by name).
pub fn bursts(held: &[HeldDelete]) -> Vec<HeldBurst> {
    let mut by_origin: std::collections::BTreeMap<&str, Vec<&HeldDelete>> = Default::default();
    for h in held {
        by_origin.entry(h.origin()).or_default().push(h);
    }
    by_origin
        .into_iter()
        .map(|(origin, held)| HeldBurst {
            origin: origin.to_string(),
            count: held.len(),
            since: rfc3339(held.iter().map(|h| h.since_ms).min().unwrap_or(0)),
            first: held.iter().take(FIRST_IDS).map(|h| h.decision.id.to_string()).collect(),
        })
        .collect()
}

/// The answer to `held`.
pub async fn list(core: &CoreHandle, node: &str) -> Result<HeldList, CoreGone> {
    let held = core.ask(|reply| Request::Held { reply }).await?;
    let entries = held
        .iter()
        .map(|h| HeldEntry {
            minion: h.decision.id.to_string(),
            origin: h.origin().to_string(),
            via: h.from.to_string(),
            since: rfc3339(h.since_ms),
            version: h.decision.version.to_string(),
        })
        .collect();
    Ok(HeldList { node: node.to_string(), bursts: bursts(&held), held: entries })
}

/// Runs `release` or `revert` with the JSON `args` (an [`OperatorRequest`]),
/// for the user `by`.
pub async fn operate(core: &CoreHandle, action: OperatorAction, args: &str, by: String) -> OperatorReply {
    let failed =
        |error: String| OperatorReply { action: action.name().into(), error: Some(error), ..Default::default() };
    let request: OperatorRequest = match serde_json::from_str(if args.trim().is_empty() { "{}" } else { args }) {
        Ok(request) => request,
        Err(e) => return failed(format!("bad {} request: {e}", action.name())),
    };
    let mut ids = Vec::with_capacity(request.ids.len());
    for id in &request.ids {
        match MinionId::parse(id) {
            Ok(id) => ids.push(id),
            Err(e) => return failed(format!("{:?}: {e}", crate::text::shown(id))),
        }
    }
    let origin = request.origin;
    let asked = core.ask(|reply| Request::Operator { action, origin, ids, by, reply }).await;
    match asked {
        Err(CoreGone) => failed("the agent is stopping".into()),
        Ok(Err(error)) => failed(error),
        Ok(Ok(outcome)) => {
            let names = |ids: Vec<MinionId>| ids.into_iter().map(|id| id.to_string()).collect();
            OperatorReply {
                action: action.name().into(),
                done: names(outcome.done),
                retrying: names(outcome.retrying),
                skipped: names(outcome.skipped),
                error: None,
            }
        }
    }
}

/// The user on the other end of a control connection (`peer_uid`: its
/// uid, from `SO_PEERCRED`), for the audit log: `name (uid N)`, or `uid N`
/// when /etc/passwd does not name it.
pub fn who(peer_uid: Option<u32>) -> String {
    let Some(uid) = peer_uid else { return "unknown user".into() };
    match crate::disk::pki::user_name(uid) {
        Some(name) => format!("{name} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}
