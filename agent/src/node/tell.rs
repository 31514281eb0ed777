//! What each event of the node machine becomes in the agent: its audit
//! record (`keysync-audit`'s [`record`], re-exported here for the effects),
//! its log line and the metrics it moves.

use keysync_machine::node::Event;

use keysync_audit::{describe, Action};
pub use keysync_audit::{record, tells};

use crate::ops::metrics::{Metrics, OriginLabel};

/// Logs `event` and moves the metrics it concerns.
pub fn log_and_count(event: &Event, metrics: &Metrics) {
    match event {
        Event::Refused { folder, name, reason, .. } => {
            tracing::warn!(folder = folder.dir_name(), file = %name.escape_debug(), reason, "refused key file")
        }
        Event::PendingSeen { id, .. } => tracing::debug!(minion = %id, "pending key"),
        Event::Decided { decision, .. } => tracing::info!(
            minion = %decision.id,
            action = Action::of(decision.verdict.kind()).as_str(),
            version = %decision.version,
            "local decision"
        ),
        Event::Applied { decision, from, replaced } => {
            if let Some(old) = replaced {
                tracing::warn!(minion = %decision.id, peer = &**from, old = %old, new = ?decision.verdict.fingerprint(), "an accepted key was replaced by another one");
            }
            let version = &decision.version;
            // Claims carry no decision time: no latency for them.
            metrics.applied(if version.is_claim() { 0 } else { version.millis() }, super::wall_ms());
            tracing::trace!(minion = %decision.id, peer = &**from, version = %version, "applied peer decision");
        }
        Event::Superseded { .. } | Event::PendingDiscarded { .. } => {}
        Event::Inventory { held } => tracing::info!(
            accepted = held.accepted,
            rejected = held.rejected,
            pending = held.pending,
            digest = %held.digest,
            "first start: what this master holds"
        ),
        Event::Kept { decision, from, shows, wrote, why } => tracing::info!(
            minion = %decision.id,
            peer = &**from,
            shows = %shows.as_ref().map_or_else(|| "no key".to_string(), describe),
            wrote,
            why,
            "first contact"
        ),
        Event::Deferred { id, from } => {
            tracing::debug!(minion = %id, peer = &**from, "deferred: the id's own events are settling")
        }
        Event::FromTheFuture { decision, from, error } => {
            metrics.decisions_refused.inc();
            tracing::warn!(minion = %decision.id, peer = &**from, error = %error, "refused a decision from the future");
        }
        Event::Conflict { conflict, .. } => {
            metrics.decisions_conflicted.inc();
            tracing::warn!(
                minion = %conflict.id,
                winner = %conflict.winner.version,
                loser = %conflict.loser.version,
                "conflicting decisions"
            );
        }
        Event::Doubted { decision, from, claimed } => tracing::warn!(
            minion = %decision.id,
            peer = &**from,
            claimed = %claimed,
            "a decision claims to have known one this master never made"
        ),
        Event::UnknownOrigins { from, n, n_origins, .. } => {
            metrics.decisions_refused.inc_by(*n as u64);
            tracing::warn!(
                peer = &**from,
                n,
                n_origins,
                "refused decisions naming an origin that is no master of this site"
            );
        }
        // Not counted as refused: no alert for this master's own past.
        Event::TakenBack { from, n, afresh_ms, .. } => tracing::info!(
            peer = &**from,
            n,
            afresh_ms,
            "took back decisions this master made before its store started afresh"
        ),
        Event::NotOurs { decision, from } => {
            metrics.decisions_refused.inc();
            tracing::warn!(minion = %decision.id, peer = &**from, version = %decision.version, "refused a decision claiming this master as its origin");
        }
        Event::Rotated => tracing::info!("dropped .dfn: the master rotates its AES key"),
        Event::RotateFailed { error } => tracing::error!(
            error = %error,
            "cannot drop .dfn; revoked minions stay connected until the master rotates its key"
        ),
        Event::WriteFailed { what, error } => {
            tracing::error!(what = %what, error = %error, "cannot write; nothing recorded, retrying with backoff")
        }
        Event::Stale { stale } => tracing::error!("{}", keysync_audit::stale(stale)),
        Event::WritesStillFailing { lasted, error } => tracing::error!(
            lasted = %humantime::format_duration(std::time::Duration::from_secs(lasted.as_secs())),
            error = %error,
            "writes still fail; nothing recorded, retrying every few seconds (status shows it)"
        ),
        Event::WriteRecovered { lasted, first_error } => {
            tracing::info!(lasted = ?lasted, first_error = %first_error, "writes succeed again")
        }
        Event::EventsLost { why, n_names } => {
            tracing::warn!(why = %why, n_names, "file events were lost; every name is read again once settled")
        }
        Event::RescanFound { n, why } => tracing::warn!(n, why = %why, "rescan found changes no event reported"),
        Event::ListFailed { error } => tracing::error!(error = %error, "cannot list the key folders"),
        Event::Reconciled { n_held, n_found, found } => {
            tracing::info!(n_held, n_found, reason = found.describe(), "start-up reconciliation")
        }
        Event::FinishingJournal { n } => tracing::info!(n, "finishing decisions interrupted by a stop"),
        Event::JournalCovered { decision } => tracing::warn!(
            minion = %decision.id,
            version = %decision.version,
            "a journalled decision was not finished: the key files changed after it"
        ),
        Event::LoadFailed { error } => tracing::error!(error = %error, "cannot read decisions for a peer"),
        Event::ColdFailed { error } => {
            tracing::error!(error = %error, "cannot read or compact the tombstones in the state store")
        }
        Event::Compacted { n, before_ms } => {
            tracing::info!(n, before_ms, "compacted tombstones older than tombstone_ttl")
        }
        Event::DeletesHeld { via, forwarded, n, limit, first } => {
            metrics.held_bursts.get_or_create(&OriginLabel { origin: via.to_string() }).inc();
            tracing::warn!(
                peer = &**via,
                forwarded,
                n,
                limit,
                first = %first.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                "a mass delete from a peer is held: `salt-keysync held` lists it, `release` or `revert` ends it"
            )
        }
        Event::PutBack { held, .. } => tracing::warn!(
            minion = %held.decision.id,
            peer = &*held.from,
            "a delete let through before its burst went past the guard's limit: key put back, delete held"
        ),
        Event::HoldEnded { via, n } => {
            tracing::warn!(peer = &**via, n, "the held burst ended; its deletes stay held until released or reverted")
        }
        Event::MassDeleteHere { n, limit } => {
            metrics.mass_deletes_here.inc();
            tracing::warn!(
                n,
                limit,
                "accepted keys deleted here faster than the guard lets through: the other masters hold these deletes"
            )
        }
        Event::HeldSettled { held, .. } => tracing::info!(
            minion = %held.decision.id,
            origin = &**held.origin(),
            "a held delete settled by a newer decision"
        ),
        Event::Operator { action, decision, by, .. } => {
            tracing::info!(minion = %decision.id, action = action.name(), by = %by, "an operator ended a held delete")
        }
        Event::StillHeld { n, origins } => tracing::warn!(
            n,
            origins = %origins.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
            "deletes held before the stop are held still"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Context, Decision, MinionId, Relays, Verdict, Version};

    /// This master's own decisions taken back after its store started
    /// afresh are one record per arrival, and no refusal: the metric behind
    /// the refused-decisions (hostile peer) alert does not move; a decision
    /// it never made still does (issue 28 item 4).
    #[test]
    fn taken_back_is_told_once_and_is_no_refusal() {
        let metrics = Metrics::new("master-a");
        let event = Event::TakenBack {
            from: keysync_machine::testkit::peer("master-b"),
            n: 94,
            first: MinionId::parse("web01").unwrap(),
            afresh_ms: 1_795_000_000_000,
        };
        let told = record(&event, "master-a").unwrap();
        assert_eq!(
            (told.action.as_str(), told.outcome.as_str(), told.via.as_str()),
            ("take-back", "taken-back", "master-b")
        );
        assert_eq!((told.minion.as_deref(), told.origin.as_deref()), (Some("web01"), Some("master-a")));
        assert_eq!(
            told.reason.as_deref(),
            Some(
                "94 decisions naming this master (master-a) as origin, made before its store started afresh at \
                 2026-11-18T11:06:40Z (`recover --from-peers`, or a new store: a reinstall): its own, forgotten with \
                 its old store, taken back"
            )
        );
        log_and_count(&event, &metrics);
        assert!(metrics.encode().contains("keysync_decisions_refused_total 0"), "{}", metrics.encode());
        let forged = Decision {
            id: MinionId::parse("web02").unwrap(),
            verdict: Verdict::Deleted,
            version: Version::new(1 << 41, "master-a"),
            context: Context::default(),
            relays: Relays::default(),
            reached: Default::default(),
        };
        log_and_count(&Event::NotOurs { decision: forged, from: keysync_machine::testkit::peer("master-b") }, &metrics);
        assert!(metrics.encode().contains("keysync_decisions_refused_total 1"), "{}", metrics.encode());
    }
}
