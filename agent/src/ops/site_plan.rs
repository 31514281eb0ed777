//! `salt-keysync plan`: what first contact does on every master, gathered by
//! the local agent over its control socket from its own node and from each
//! peer's Plan call (mutual TLS, read-only), then joined per id so each id
//! shows every master's row.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use keysync_machine::node::{Holding, PlanRow};
use keysync_proto::v1;
use keysync_server::TlsSetup;
use serde::{Deserialize, Serialize};

use crate::config::Peer;
use crate::core::{Fingerprint, MinionId};
use crate::node::{CoreGone, CoreHandle, Request};

/// Most ids one Plan call may name (as one Fetch).
pub const MAX_PLAN_IDS: usize = keysync_machine::node::MAX_FETCH;
/// Most rows one master answers with; more are left out (`truncated`).
pub const MAX_PLAN_ROWS: usize = 20_000;
/// Longest reason a peer may send (it is shown, escaped, in a table).
const MAX_WHY: usize = 300;
const PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// What one master holds or will hold for an id, as shown and sent as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shown {
    /// nothing, pending, accepted or rejected.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub minion: String,
    pub holds: Shown,
    pub will: Shown,
    /// Masters may show different things for it until an operator decides.
    pub conflict: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterPlan {
    pub node: String,
    pub observe: bool,
    /// Why this master could not be asked; its rows are then unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub truncated: bool,
    pub rows: Vec<Entry>,
}

/// Every master's rows, this agent's first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SitePlan {
    pub masters: Vec<MasterPlan>,
}

impl SitePlan {
    /// Every id some master has a row for, in order.
    pub fn ids(&self) -> BTreeSet<&str> {
        self.masters.iter().flat_map(|m| m.rows.iter().map(|r| r.minion.as_str())).collect()
    }
}

fn shown(holding: &Holding) -> Shown {
    let (state, fingerprint) = match holding {
        Holding::Nothing => ("nothing", None),
        Holding::Pending(fp) => ("pending", Some(fp)),
        Holding::Accepted(fp) => ("accepted", Some(fp)),
        Holding::Rejected(fp) => ("rejected", Some(fp)),
    };
    Shown { state: state.into(), fingerprint: fingerprint.map(ToString::to_string) }
}

pub fn entry(row: &PlanRow) -> Entry {
    Entry {
        minion: row.id.to_string(),
        holds: shown(&row.holds),
        will: shown(&row.will),
        conflict: row.conflict,
        why: row.why.map(str::to_string),
    }
}

fn holding_to_wire(holding: &Holding) -> v1::Holding {
    use v1::holding::State;
    let (state, fingerprint) = match holding {
        Holding::Nothing => (State::Nothing, None),
        Holding::Pending(fp) => (State::Pending, Some(fp)),
        Holding::Accepted(fp) => (State::Accepted, Some(fp)),
        Holding::Rejected(fp) => (State::Rejected, Some(fp)),
    };
    v1::Holding { state: state as i32, fingerprint: fingerprint.map(|fp| fp.0.to_vec()).unwrap_or_default() }
}

pub fn row_to_wire(row: &PlanRow) -> v1::PlanRow {
    v1::PlanRow {
        minion: row.id.to_string(),
        holds: Some(holding_to_wire(&row.holds)),
        will: Some(holding_to_wire(&row.will)),
        conflict: row.conflict,
        why: row.why.unwrap_or_default().to_string(),
    }
}

/// A peer's row, checked: a valid minion id, known states, 32-byte
/// fingerprints; `None` for anything else (a peer is trusted to replicate,
/// not to feed this table garbage).
fn entry_from_wire(msg: v1::PlanRow) -> Option<Entry> {
    use v1::holding::State;
    let shown_of = |holding: Option<v1::Holding>| -> Option<Shown> {
        let holding = holding?;
        let fingerprint = || Some(Fingerprint(holding.fingerprint.as_slice().try_into().ok()?).to_string());
        let (state, fingerprint) = match State::try_from(holding.state).ok()? {
            State::Nothing => ("nothing", None),
            State::Pending => ("pending", Some(fingerprint()?)),
            State::Accepted => ("accepted", Some(fingerprint()?)),
            State::Rejected => ("rejected", Some(fingerprint()?)),
            State::Unspecified => return None,
        };
        Some(Shown { state: state.into(), fingerprint })
    };
    let minion = MinionId::parse(&msg.minion).ok()?.to_string();
    let why: String = msg.why.chars().take(MAX_WHY).collect();
    Some(Entry {
        minion,
        holds: shown_of(msg.holds)?,
        will: shown_of(msg.will)?,
        conflict: msg.conflict,
        why: (!why.is_empty()).then_some(why),
    })
}

/// This node's rows for a peer's Plan call: the ids in dispute, or exactly
/// the ids asked for (at most [`MAX_PLAN_IDS`]; invalid ones are skipped).
pub async fn answer(
    node: &str,
    observe: bool,
    core: &CoreHandle,
    ids: Vec<String>,
) -> Result<v1::PlanResponse, CoreGone> {
    let ids = if ids.is_empty() {
        None
    } else {
        Some(ids.iter().take(MAX_PLAN_IDS).filter_map(|id| MinionId::parse(id).ok()).collect())
    };
    let rows = core.ask(|reply| Request::Plan { ids, reply }).await?;
    let truncated = rows.len() > MAX_PLAN_ROWS;
    Ok(v1::PlanResponse {
        node: node.to_string(),
        observe,
        rows: rows.iter().take(MAX_PLAN_ROWS).map(row_to_wire).collect(),
        truncated,
    })
}

/// What the local agent needs to gather the site's plan.
pub struct Gather {
    pub node: String,
    pub observe: bool,
    pub core: CoreHandle,
    pub tls: tokio::sync::watch::Receiver<Arc<TlsSetup>>,
    pub max_message_bytes: usize,
}

impl Gather {
    /// Asks this node and every peer (at once), then asks each master again
    /// for the ids only other masters named, so every id shows every master.
    pub async fn site(&self, peers: &[Peer]) -> SitePlan {
        let tls = self.tls.borrow().clone();
        let mut masters = vec![self.local(None).await];
        masters.extend(self.remotes(peers, &tls, |_| Vec::new()).await);
        let all: Vec<String> = SitePlan { masters: masters.clone() }.ids().into_iter().map(str::to_string).collect();
        let missing = |master: &MasterPlan| -> Vec<String> {
            let have: BTreeSet<&str> = master.rows.iter().map(|r| r.minion.as_str()).collect();
            all.iter().filter(|id| !have.contains(id.as_str())).take(MAX_PLAN_IDS).cloned().collect()
        };
        let local_missing: Vec<MinionId> =
            missing(&masters[0]).iter().filter_map(|id| MinionId::parse(id).ok()).collect();
        if !local_missing.is_empty() {
            let more = self.local(Some(local_missing)).await;
            masters[0].rows.extend(more.rows);
        }
        let wanted: Vec<Vec<String>> = masters[1..].iter().map(missing).collect();
        let asked: Vec<&Peer> = peers.iter().zip(&wanted).filter(|(_, ids)| !ids.is_empty()).map(|(p, _)| p).collect();
        let mut more = self
            .remotes(&asked.into_iter().cloned().collect::<Vec<_>>(), &tls, |peer| {
                peers.iter().position(|p| p.name == peer.name).map(|i| wanted[i].clone()).unwrap_or_default()
            })
            .await;
        for master in masters.iter_mut().skip(1) {
            if let Some(at) = more.iter().position(|m| m.node == master.node) {
                let again = more.swap_remove(at);
                match again.error {
                    Some(error) if master.error.is_none() => master.error = Some(error),
                    _ => master.rows.extend(again.rows),
                }
            }
        }
        for master in &mut masters {
            master.rows.sort_by(|a, b| a.minion.cmp(&b.minion));
        }
        SitePlan { masters }
    }

    /// Asks every peer of `peers` for its rows at once (`ids` per peer).
    async fn remotes(
        &self,
        peers: &[Peer],
        tls: &Arc<TlsSetup>,
        ids: impl Fn(&Peer) -> Vec<String>,
    ) -> Vec<MasterPlan> {
        let mut asked = tokio::task::JoinSet::new();
        for (idx, peer) in peers.iter().enumerate() {
            let (peer, tls, ids, max) = (peer.clone(), tls.clone(), ids(peer), self.max_message_bytes);
            let node = self.node.clone();
            asked.spawn(async move { (idx, remote(peer, tls, ids, max, &node).await) });
        }
        let mut answers: Vec<(usize, MasterPlan)> = asked.join_all().await;
        answers.sort_by_key(|(idx, _)| *idx);
        answers.into_iter().map(|(_, plan)| plan).collect()
    }

    async fn local(&self, ids: Option<Vec<MinionId>>) -> MasterPlan {
        let mut plan = MasterPlan {
            node: self.node.clone(),
            observe: self.observe,
            error: None,
            truncated: false,
            rows: Vec::new(),
        };
        match self.core.ask(|reply| Request::Plan { ids, reply }).await {
            Ok(rows) => {
                plan.truncated = rows.len() > MAX_PLAN_ROWS;
                plan.rows = rows.iter().take(MAX_PLAN_ROWS).map(entry).collect();
            }
            Err(e) => plan.error = Some(e.to_string()),
        }
        plan
    }
}

/// Asks one peer's agent for its rows.
async fn remote(peer: Peer, tls: Arc<TlsSetup>, ids: Vec<String>, max_message_bytes: usize, node: &str) -> MasterPlan {
    let asked = async {
        let mut client = keysync_server::connect(&peer.address, &peer.name, &tls, max_message_bytes, PEER_TIMEOUT)
            .await
            .map_err(|e| crate::net::cause::describe(&e, &peer.name, node))?;
        let reply = client.plan(v1::PlanRequest { minions: ids }).await.map_err(|status| match status.code() {
            tonic::Code::Unimplemented => "its agent is too old to answer (upgrade salt-keysync there)".to_string(),
            _ => status.message().to_string(),
        })?;
        Ok::<_, String>(reply.into_inner())
    };
    let mut plan =
        MasterPlan { node: peer.name.to_string(), observe: false, error: None, truncated: false, rows: Vec::new() };
    match tokio::time::timeout(PEER_TIMEOUT, asked).await {
        Ok(Ok(reply)) => {
            plan.observe = reply.observe;
            plan.truncated = reply.truncated || reply.rows.len() > MAX_PLAN_ROWS;
            plan.rows = reply.rows.into_iter().take(MAX_PLAN_ROWS).filter_map(entry_from_wire).collect();
        }
        Ok(Err(error)) => plan.error = Some(error),
        Err(_) => plan.error = Some(format!("no answer within {PEER_TIMEOUT:?}")),
    }
    plan
}
