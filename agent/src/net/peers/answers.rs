//! What a peer's answers bring, checked as they come: a Fetch's decisions,
//! and the bucket a Diff answer brings with it (see `peers.rs`).

use keysync_machine::node::{Fetch, Whole, FIRST_BUCKET_MOST};
use keysync_proto::v1::{self, key_sync_client::KeySyncClient};
use prost::Message;
use tonic::transport::Channel;

use super::{Answering, PeerLink, SessionError};
use crate::core::digest::{bucket_of, N_BUCKETS};
use crate::core::{Decision, MinionId};
use crate::net::wire::decision_from_wire;

impl PeerLink {
    /// Fetches the decisions for `fetch`'s ids and whole buckets; returns
    /// them with the bytes sent and received. Invalid ones are audited and
    /// left out.
    pub(super) async fn fetch(
        &self,
        client: &mut KeySyncClient<Channel>,
        fetch: &Fetch,
    ) -> Result<(Vec<Decision>, usize, usize), SessionError> {
        let ids = &fetch.ids;
        let minions = ids.iter().map(ToString::to_string).collect();
        let request = v1::FetchRequest { minions, buckets: fetch.buckets.clone() };
        let sent = request.encoded_len();
        let mut received = 0;
        let answering = Answering::start("Fetch");
        let mut stream = answering.opening(client.fetch(request)).await?.into_inner();
        let mut decisions: Vec<Decision> = Vec::with_capacity(ids.len() + fetch.n_in_buckets);
        // Read as it comes, and refused as soon as it gives more than was
        // asked: an id neither asked for nor in a bucket asked for, or more
        // rows than the ids can have.
        let asked: std::collections::HashSet<&MinionId> = ids.iter().collect();
        let mut in_buckets = [false; N_BUCKETS];
        for &bucket in &fetch.buckets {
            if let Some(slot) = in_buckets.get_mut(bucket as usize) {
                *slot = true;
            }
        }
        let asked_for = |id: &MinionId| asked.contains(id) || in_buckets[bucket_of(id)];
        let most = fetch.most_rows();
        let mut n_rows = 0;
        while let Some(batch) = answering.message(stream.message()).await? {
            received += batch.encoded_len();
            n_rows += batch.decisions.len();
            if n_rows > most {
                return Err(SessionError::BadFetch(format!(
                    "more than {most} decisions for the {} ids asked for",
                    ids.len()
                )));
            }
            for msg in batch.decisions {
                match decision_from_wire(msg) {
                    Ok(decision) if !asked_for(&decision.id) => {
                        return Err(SessionError::BadFetch(format!("a decision for {:?}, not asked for", decision.id)));
                    }
                    Ok(decision) => decisions.push(decision),
                    Err(e) => crate::net::rpc::audit_refused(&self.audit, self.board.metrics(), &self.peer.name, &e),
                }
            }
        }
        Ok((decisions, sent, received))
    }

    /// The bucket a Diff answer brings, as the answer to a fetch of it: one
    /// of the buckets it sends whole, and no decision outside it nor more
    /// than such a fetch may bring (a malformed decision is audited and
    /// left out, as in a fetch's answer).
    pub(super) fn first_bucket(
        &self,
        bucket: Option<u32>,
        wire: Vec<v1::Decision>,
        whole: &[Whole],
    ) -> Result<Option<(Fetch, Vec<Decision>)>, SessionError> {
        let Some(fetch) = brought(bucket, wire.len(), whole).map_err(SessionError::BadDiff)? else {
            return Ok(None);
        };
        let bucket = fetch.buckets[0];
        let mut decisions = Vec::with_capacity(wire.len());
        for msg in wire {
            match decision_from_wire(msg) {
                Ok(decision) if bucket_of(&decision.id) != bucket as usize => {
                    return Err(SessionError::BadDiff(format!("{:?} brought as in bucket {bucket}", decision.id)));
                }
                Ok(decision) => decisions.push(decision),
                Err(e) => crate::net::rpc::audit_refused(&self.audit, self.board.metrics(), &self.peer.name, &e),
            }
        }
        Ok(Some((fetch, decisions)))
    }
}

/// The fetch a Diff answer bringing `n_decisions` of `bucket` answers, if
/// it is one: the bucket must be one of those it sends `whole`, and the
/// decisions no more than a fetch of it may bring; decisions of no bucket
/// are refused. A bucket larger than [`FIRST_BUCKET_MOST`] is left to a
/// fetch, unread (a later release may bring larger ones).
pub(super) fn brought(bucket: Option<u32>, n_decisions: usize, whole: &[Whole]) -> Result<Option<Fetch>, String> {
    let Some(bucket) = bucket else {
        return match n_decisions {
            0 => Ok(None),
            n => Err(format!("{n} decisions of no bucket")),
        };
    };
    let Some(&(_, n)) = whole.iter().find(|&&(b, _)| b == bucket) else {
        return Err(format!("bucket {bucket} brought, not one sent whole"));
    };
    if n > FIRST_BUCKET_MOST {
        return Ok(None);
    }
    let fetch = Fetch { buckets: vec![bucket], n_in_buckets: n as usize, ..Fetch::default() };
    if n_decisions > fetch.most_rows() {
        return Err(format!("{n_decisions} decisions in bucket {bucket} of {n}"));
    }
    Ok(Some(fetch))
}
