//! What each event of the node machine becomes: its audit record (if any),
//! its log line and the metrics it moves. The one place records of the
//! node's decisions are built.

use keysync_machine::node::{Event, Side};

use crate::core::Decision;
use crate::disk::audit::Record;
use crate::ops::metrics::Metrics;

/// The audit record of `event`, recorded on `node`; `None` for events that
/// are only logged.
pub fn record(event: &Event, node: &str) -> Option<Record> {
    let record = match event {
        Event::Refused { folder, name, id, reason } => Record {
            minion: Some(id.as_ref().map_or_else(|| name.escape_debug().to_string(), ToString::to_string)),
            origin: Some(node.to_string()),
            reason: Some(format!("{}/{}: {reason}", folder.dir_name(), name.escape_debug())),
            ..Record::new("refuse", "local", "refused")
        },
        Event::PendingSeen { id, fingerprint } => Record {
            minion: Some(id.to_string()),
            fingerprint: Some(fingerprint.to_string()),
            origin: Some(node.to_string()),
            ..Record::new("pending", "local", "observed")
        },
        Event::Decided { decision, found } => Record {
            minion: Some(decision.id.to_string()),
            fingerprint: decision.verdict.fingerprint().map(|f| f.to_string()),
            origin: Some(node.to_string()),
            version: Some(decision.version.to_string()),
            other_version: decision.supersedes.as_ref().map(ToString::to_string),
            reason: found.map(|found| found.describe().to_string()),
            ..Record::new(decision.verdict.kind().action(), "local", "applied")
        },
        Event::Applied { decision, from } => {
            remote_record(decision, from, decision.verdict.kind().action(), "applied", None)
        }
        Event::Superseded { decision, from, held } => remote_record(
            decision,
            from,
            decision.verdict.kind().action(),
            "superseded",
            Some(format!("holds newer {held}")),
        ),
        Event::FromTheFuture { decision, from, error } => {
            remote_record(decision, from, "refuse", "refused", Some(error.to_string()))
        }
        Event::Conflict { id, from, winner, loser } => Record {
            minion: Some(id.to_string()),
            fingerprint: winner.fingerprint.map(|f| f.to_string()),
            other_fingerprint: loser.fingerprint.map(|f| f.to_string()),
            origin: Some(winner.version.node.to_string()),
            version: Some(winner.version.to_string()),
            other_version: Some(loser.version.to_string()),
            reason: Some(format!(
                "{} at {} and {} at {} were made concurrently; {} wins",
                kind(winner),
                winner.version.node,
                kind(loser),
                loser.version.node,
                winner.version
            )),
            ..Record::new("conflict", from, "resolved")
        },
        Event::PendingDiscarded { id, from, origin, pending, decided } => Record {
            minion: Some(id.to_string()),
            fingerprint: Some(pending.to_string()),
            other_fingerprint: decided.map(|f| f.to_string()),
            origin: Some(origin.to_string()),
            reason: Some("a different pending key was discarded for the decided one".into()),
            ..Record::new("pending", from, "discarded")
        },
        Event::RotateFailed { error } => {
            Record { reason: Some(error.clone()), ..Record::new("rotate", "local", "failed") }
        }
        Event::WriteFailed { what, error } => Record {
            reason: Some(format!("{what}: {error}; nothing recorded, retrying with backoff")),
            ..Record::new("write", "local", "failed")
        },
        Event::WriteRecovered { lasted, first_error } => Record {
            reason: Some(format!("writes succeed again after {lasted:.1?} (first error: {first_error})")),
            ..Record::new("write", "local", "recovered")
        },
        Event::Rotated
        | Event::Deferred { .. }
        | Event::EventsLost { .. }
        | Event::RescanFound { .. }
        | Event::ListFailed { .. }
        | Event::Reconciled { .. }
        | Event::FinishingJournal { .. }
        | Event::LoadFailed { .. } => return None,
    };
    Some(record)
}

/// Logs `event` and moves the metrics it concerns.
pub fn log_and_count(event: &Event, metrics: &Metrics) {
    match event {
        Event::Refused { folder, name, reason, .. } => {
            tracing::warn!(folder = folder.dir_name(), file = %name.escape_debug(), reason, "refused key file")
        }
        Event::PendingSeen { id, .. } => tracing::debug!(minion = %id, "pending key"),
        Event::Decided { decision, .. } => tracing::info!(
            minion = %decision.id,
            action = decision.verdict.kind().action(),
            version = %decision.version,
            "local decision"
        ),
        Event::Applied { decision, from } => {
            let version = &decision.version;
            // Bootstrap versions carry no decision time: no latency for them.
            metrics.applied(if version.is_bootstrap() { 0 } else { version.millis() }, super::wall_ms());
            tracing::trace!(minion = %decision.id, peer = &**from, version = %version, "applied peer decision");
        }
        Event::Superseded { .. } | Event::PendingDiscarded { .. } => {}
        Event::Deferred { id, from } => {
            tracing::debug!(minion = %id, peer = &**from, "deferred: the id's own events are settling")
        }
        Event::FromTheFuture { decision, from, error } => {
            metrics.decisions_refused.inc();
            tracing::warn!(minion = %decision.id, peer = &**from, error = %error, "refused a decision from the future");
        }
        Event::Conflict { id, winner, loser, .. } => {
            metrics.decisions_conflicted.inc();
            tracing::warn!(minion = %id, winner = %winner.version, loser = %loser.version, "concurrent decisions");
        }
        Event::Rotated => tracing::info!("dropped .dfn: the master rotates its AES key"),
        Event::RotateFailed { error } => tracing::error!(
            error = %error,
            "cannot drop .dfn; revoked minions stay connected until the master rotates its key"
        ),
        Event::WriteFailed { what, error } => {
            tracing::error!(what = %what, error = %error, "cannot write; nothing recorded, retrying with backoff")
        }
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
        Event::LoadFailed { error } => tracing::error!(error = %error, "cannot read decisions for a peer"),
    }
}

fn kind(side: &Side) -> &'static str {
    side.kind.map_or("none", |kind| kind.action())
}

fn remote_record(decision: &Decision, from: &str, action: &str, outcome: &str, reason: Option<String>) -> Record {
    Record {
        minion: Some(decision.id.to_string()),
        fingerprint: decision.verdict.fingerprint().map(|f| f.to_string()),
        origin: Some(decision.version.node.to_string()),
        version: Some(decision.version.to_string()),
        reason,
        ..Record::new(action, from, outcome)
    }
}
