//! What each event of the node machine is recorded as in the audit log:
//! [`record`], the one place records of the node's decisions are built
//! (the agent logs and counts the same events in its `node/tell.rs`).

use keysync_machine::core::merge::Conflict;
use keysync_machine::core::{Decision, Seen, Version};
use keysync_machine::node::{Event, OperatorAction, Settled};
use keysync_machine::PeerName;

use crate::{Action, Outcome, Record, Via};

/// The audit record of `event`, recorded on `node`; `None` for events that
/// are only logged.
pub fn record(event: &Event, node: &str) -> Option<Record> {
    let record = match event {
        Event::Refused { folder, name, id, reason } => Record {
            minion: Some(id.as_ref().map_or_else(|| name.escape_debug().to_string(), ToString::to_string)),
            origin: Some(node.to_string()),
            reason: Some(format!("{}/{}: {reason}", folder.dir_name(), name.escape_debug())),
            ..Record::new(Action::Refuse, Via::Local, Outcome::Refused)
        },
        Event::PendingSeen { id, fingerprint } => Record {
            minion: Some(id.to_string()),
            fingerprint: Some(fingerprint.to_string()),
            origin: Some(node.to_string()),
            ..Record::new(Action::Pending, Via::Local, Outcome::Observed)
        },
        Event::Decided { decision, found } => Record {
            minion: Some(decision.id.to_string()),
            fingerprint: decision.verdict.fingerprint().map(|f| f.to_string()),
            origin: Some(node.to_string()),
            version: Some(decision.version.to_string()),
            other_version: decision.context.highest().map(ToString::to_string),
            reason: found.map(|found| found.describe().to_string()),
            ..Record::new(Action::of(decision.verdict.kind()), Via::Local, Outcome::Applied)
        },
        Event::Applied { decision, from, replaced: None } => {
            remote_record(decision, from, Action::of(decision.verdict.kind()), Outcome::Applied, None)
        }
        // One accepted key replaced by another: never a plain "accept applied".
        Event::Applied { decision, from, replaced: Some(old) } => Record {
            other_fingerprint: Some(old.to_string()),
            ..remote_record(
                decision,
                from,
                Action::Accept,
                Outcome::Replaced,
                Some(format!("the accepted key {old} was replaced by another one")),
            )
        },
        Event::Doubted { decision, from, claimed } => remote_record(
            decision,
            from,
            Action::of(decision.verdict.kind()),
            Outcome::Doubted,
            Some(format!("claims to have known {claimed}, which this master ({node}) never made; taken as not known")),
        ),
        Event::NotOurs { decision, from } => remote_record(
            decision,
            from,
            Action::Refuse,
            Outcome::Refused,
            Some(format!("{} claims this master ({node}) as its origin, which never made it", decision.version)),
        ),
        Event::Superseded { decision, from, held } => remote_record(
            decision,
            from,
            Action::of(decision.verdict.kind()),
            Outcome::Superseded,
            Some(format!("holds newer {held}")),
        ),
        Event::FromTheFuture { decision, from, error } => {
            remote_record(decision, from, Action::Refuse, Outcome::Refused, Some(error.to_string()))
        }
        Event::Inventory { held } => Record {
            reason: Some(format!(
                "first start: {} accepted, {} rejected, {} pending; sha256 of the accepted and rejected keys {}",
                held.accepted, held.rejected, held.pending, held.digest
            )),
            ..Record::new(Action::Inventory, Via::Local, Outcome::Observed)
        },
        Event::Kept { decision, from, shows, wrote, why } => Record {
            other_fingerprint: shows.as_ref().and_then(|s| s.fingerprint).map(|f| f.to_string()),
            other_version: shows.as_ref().map(|s| s.version.to_string()),
            reason: Some(format!(
                "{why}; this master shows {}",
                shows.as_ref().map_or_else(|| "no key".to_string(), describe)
            )),
            ..remote_record(
                decision,
                from,
                Action::of(decision.verdict.kind()),
                if *wrote { Outcome::Ruled } else { Outcome::Kept },
                None,
            )
        },
        Event::Conflict { conflict, from } => {
            let (winner, loser) = (&conflict.winner, &conflict.loser);
            let reason = if winner.version.is_claim() && loser.version.is_claim() {
                format!(
                    "two keys were held for this id when the agents met ({} and {}); no master comes to trust the other's key: each keeps its own until an operator decides with salt-key",
                    describe(winner),
                    describe(loser)
                )
            } else if winner.version.is_claim() || loser.version.is_claim() {
                format!(
                    "the live {} did not know that a master had rejected this key before its agent started; that master keeps the rejection until an operator decides with salt-key",
                    describe(if winner.version.is_claim() { loser } else { winner })
                )
            } else if winner.version == loser.version {
                format!(
                    "{} carries two contents ({} and {}); {} is kept everywhere",
                    winner.version,
                    describe(winner),
                    describe(loser),
                    describe(winner)
                )
            } else {
                format!(
                    "{} at {} and {} at {} were made concurrently; {} is the later",
                    describe(winner),
                    winner.version.node,
                    describe(loser),
                    loser.version.node,
                    winner.version
                )
            };
            Record {
                minion: Some(conflict.id.to_string()),
                fingerprint: winner.fingerprint.map(|f| f.to_string()),
                other_fingerprint: loser.fingerprint.map(|f| f.to_string()),
                origin: origin_of(&winner.version),
                version: Some(winner.version.to_string()),
                other_version: Some(loser.version.to_string()),
                reason: Some(reason),
                ..Record::new(Action::Conflict, Via::from_source(from), Outcome::Resolved)
            }
        }
        Event::PendingDiscarded { id, from, origin, pending, decided } => Record {
            minion: Some(id.to_string()),
            fingerprint: Some(pending.to_string()),
            other_fingerprint: decided.map(|f| f.to_string()),
            origin: Some(origin.to_string()),
            reason: Some("a different pending key was discarded for the decided one".into()),
            ..Record::new(Action::Pending, Via::from_source(from), Outcome::Discarded)
        },
        Event::RotateFailed { error } => {
            Record { reason: Some(error.to_string()), ..Record::new(Action::Rotate, Via::Local, Outcome::Failed) }
        }
        Event::WriteFailed { what, error } => Record {
            reason: Some(format!("{what}: {error}; nothing recorded, retrying with backoff")),
            ..Record::new(Action::Write, Via::Local, Outcome::Failed)
        },
        Event::WritesStillFailing { .. } => return None,
        Event::Stale { stale } => {
            Record { reason: Some(self::stale(stale)), ..Record::new(Action::Stale, Via::Local, Outcome::Refused) }
        }
        Event::WriteRecovered { lasted, first_error } => Record {
            reason: Some(format!("writes succeed again after {lasted:.1?} (first error: {first_error})")),
            ..Record::new(Action::Write, Via::Local, Outcome::Recovered)
        },
        Event::DeletesHeld { via, forwarded: false, n, limit, first } => Record {
            reason: Some(format!(
                "{n} deletes of accepted keys came from {via} faster than the guard lets through (at most {limit} \
                 within its window here): held, with every further one from {via} until it has been quiet for a \
                 window; first held: {}; `salt-keysync held` lists them, `release` applies them here, `revert` \
                 restores the keys on every master",
                first.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            )),
            ..Record::new(Action::Hold, Via::Peer(via), Outcome::Held)
        },
        Event::DeletesHeld { via, forwarded: true, n, limit, first } => Record {
            reason: Some(format!(
                "{n} deletes of accepted keys made on other masters and forwarded by {via} took the deletes from all \
                 peers past what the guard lets through (at most {limit} within its window here): held, with every \
                 further forwarded one until the peers have been quiet; first held: {}; `salt-keysync held` lists \
                 them, `release` applies them here, `revert` restores the keys on every master",
                first.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            )),
            ..Record::new(Action::Hold, Via::Peer(via), Outcome::Held)
        },
        Event::HoldEnded { via, n } => Record {
            reason: Some(format!(
                "{via} has been quiet for a window: {n} deletes it brought were held in this burst (held still, \
                 until released or reverted); its next deletes are judged afresh"
            )),
            ..Record::new(Action::Hold, Via::Peer(via), Outcome::Ended)
        },
        Event::UnknownOrigins { from, n, n_origins, origins, first } => Record {
            minion: Some(first.to_string()),
            reason: Some(format!(
                "{n} decisions name an origin that is no master of this site ({n_origins} names: {}{}): refused; \
                 a peer decides only as itself or as a configured master",
                origins.iter().map(|o| format!("{o:?}")).collect::<Vec<_>>().join(", "),
                if *n_origins > origins.len() { ", …" } else { "" }
            )),
            ..Record::new(Action::Refuse, Via::from_source(from), Outcome::Refused)
        },
        // Its own decisions, not a refusal: one record per arrival (the
        // ones that change something are audited as applied besides).
        Event::TakenBack { from, n, first, afresh_ms } => Record {
            minion: Some(first.to_string()),
            origin: Some(node.to_string()),
            reason: Some(format!(
                "{n} {} naming this master ({node}) as origin, made before its store started afresh at {} \
                 (`recover --from-peers`, or a new store: a reinstall): its own, forgotten with its old store, \
                 taken back",
                if *n == 1 { "decision" } else { "decisions" },
                humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(*afresh_ms))
            )),
            ..Record::new(Action::TakeBack, Via::from_source(from), Outcome::TakenBack)
        },
        Event::MassDeleteHere { n, limit } => Record {
            origin: Some(node.to_string()),
            reason: Some(format!(
                "{n} accepted keys were deleted on this master within the guard's window (more than {limit}): the \
                 other masters hold these deletes until an operator releases or reverts them there"
            )),
            ..Record::new(Action::Hold, Via::Local, Outcome::Detected)
        },
        Event::HeldSettled { held, how } => {
            let reason = match how {
                Settled::By(by) => format!(
                    "the held delete {} from {} is settled by {} ({}), which knew it or is newer",
                    held.decision.version,
                    held.origin(),
                    by.version,
                    describe(by)
                ),
                Settled::NotAccepted => format!(
                    "the held delete {} from {} no longer deletes an accepted key here: applied as any other",
                    held.decision.version,
                    held.origin()
                ),
                Settled::Rejudged => format!(
                    "the held delete {} was held as forwarded by {}; it came from its origin {} too: judged again \
                     with {}'s own deletes",
                    held.decision.version,
                    held.from,
                    held.origin(),
                    held.origin()
                ),
            };
            let outcome = match how {
                Settled::By(_) => Outcome::Superseded,
                Settled::NotAccepted | Settled::Rejudged => Outcome::Unheld,
            };
            Record {
                other_version: Some(held.decision.version.to_string()),
                ..remote_record(&held.decision, &held.from, Action::Delete, outcome, Some(reason))
            }
        }
        Event::PutBack { held, key } => Record {
            fingerprint: Some(key.to_string()),
            ..remote_record(
                &held.decision,
                &held.from,
                Action::Delete,
                Outcome::PutBack,
                Some(format!(
                    "applied here before {} went on deleting accepted keys past the guard's limit (a mass delete \
                     slower than `quiet`, as `salt-key -D` with salt-master stopped): the key is written back from \
                     what this master kept, and the delete held with the rest of the burst",
                    held.from
                )),
            )
        },
        Event::Operator { action, decision, by, held } => Record {
            minion: Some(decision.id.to_string()),
            fingerprint: decision.verdict.fingerprint().map(|f| f.to_string()),
            origin: Some(node.to_string()),
            version: Some(decision.version.to_string()),
            other_version: Some(held.decision.version.to_string()),
            reason: Some(match action {
                OperatorAction::Release => format!(
                    "run by {by}: releases the delete {} made on {} that the guard held; every master applies it",
                    held.decision.version,
                    held.origin()
                ),
                OperatorAction::Revert => format!(
                    "run by {by}: reverts the delete {} made on {} that the guard held; the key is accepted again on \
                     every master, {} included",
                    held.decision.version,
                    held.origin(),
                    held.origin()
                ),
            }),
            ..Record::new(Action::operator(*action), Via::Local, Outcome::Applied)
        },
        Event::JournalCovered { decision } => remote_record(
            decision,
            &PeerName::journal(),
            Action::of(decision.verdict.kind()),
            Outcome::Superseded,
            Some(
                "journalled before the agent stopped, not finished: the key files changed after it (an operator's \
                 change, read as a decision at start-up)"
                    .into(),
            ),
        ),
        Event::StillHeld { n, origins } => Record {
            reason: Some(format!(
                "{n} deletes held before the agent stopped are held still (from {})",
                origins.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            )),
            ..Record::new(Action::Hold, Via::Local, Outcome::Held)
        },
        Event::Rotated
        | Event::Deferred { .. }
        | Event::EventsLost { .. }
        | Event::RescanFound { .. }
        | Event::ListFailed { .. }
        | Event::Reconciled { .. }
        | Event::FinishingJournal { .. }
        | Event::LoadFailed { .. }
        | Event::ColdFailed { .. }
        | Event::Compacted { .. } => return None,
    };
    Some(record)
}

/// What the log, the audit log, `status` and the service's status line say
/// of a master that may have missed deletes its peers have forgotten.
pub fn stale(stale: &keysync_machine::node::Stale) -> String {
    let at = |ms: u64| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms));
    format!(
        "out of contact with every peer since {}: {} has since forgotten deletes made up to {} (tombstone_ttl), \
         which this master may have missed, so it offers and applies nothing; `salt-keysync plan` lists the keys \
         `salt-keysync rejoin` sets aside (stop the agent, run it, start the agent: it then joins as a new master)",
        at(stale.last_contact_ms),
        stale.peer,
        at(stale.peer_forgot_ms)
    )
}

/// What a decision said, for a reason or a log line: "accept 3f:a1:…" or "delete".
pub fn describe(seen: &Seen) -> String {
    match seen.fingerprint {
        Some(fingerprint) => format!("{} {}", seen.kind.action(), &fingerprint.to_string()[..11]),
        None => seen.kind.action().to_string(),
    }
}

/// The master a decision was made on; none for a claim, which names its
/// content, not a master (the audit's `via` and `relays` tell where it came from).
fn origin_of(version: &Version) -> Option<String> {
    (!version.is_claim() || !version.node.starts_with('-')).then(|| version.node.to_string())
}

/// Whether `record` tells `conflict` (same id and the same two versions).
pub fn tells(record: &Record, conflict: &Conflict) -> bool {
    record.action == Action::Conflict.as_str()
        && record.minion.as_deref() == Some(conflict.id.as_str())
        && record.version.as_deref() == Some(conflict.winner.version.to_string().as_str())
        && record.other_version.as_deref() == Some(conflict.loser.version.to_string().as_str())
}

fn remote_record(
    decision: &Decision,
    from: &PeerName,
    action: Action,
    outcome: Outcome,
    reason: Option<String>,
) -> Record {
    // The path before `from` (which is the path's last entry when it relayed).
    let before: Vec<String> = decision.relays.iter().filter(|r| *r != from.as_str()).map(str::to_string).collect();
    Record {
        minion: Some(decision.id.to_string()),
        fingerprint: decision.verdict.fingerprint().map(|f| f.to_string()),
        origin: origin_of(&decision.version),
        version: Some(decision.version.to_string()),
        relays: (!before.is_empty()).then_some(before),
        reason,
        ..Record::new(action, Via::from_source(from), outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keysync_machine::core::{Context, MinionId, PublicKey, Relays, Verdict};

    /// A replaced accepted key is audited as `accept` / `replaced` with both
    /// fingerprints (issue 14 item 5); a plain accept is `applied`.
    #[test]
    fn a_replaced_key_names_both_fingerprints() {
        let old = PublicKey::new(keysync_machine::testkit::PUB.as_bytes());
        let new = PublicKey::new(keysync_machine::testkit::PUB.replace("mwIDAQAB", "mwIDAQAC").as_bytes());
        let decision = Decision {
            id: MinionId::parse("web01").unwrap(),
            verdict: Verdict::Accepted(new.clone()),
            version: Version::new(1 << 40, "master-b"),
            context: Context::default(),
            relays: Relays::default(),
            reached: Default::default(),
        };
        let applied = Event::Applied {
            decision: decision.clone(),
            from: keysync_machine::testkit::peer("master-b"),
            replaced: None,
        };
        let plain = record(&applied, "master-a").unwrap();
        assert_eq!((plain.action.as_str(), plain.outcome.as_str()), ("accept", "applied"));
        let replaced = Event::Applied {
            decision,
            from: keysync_machine::testkit::peer("master-b"),
            replaced: Some(old.fingerprint()),
        };
        let told = record(&replaced, "master-a").unwrap();
        assert_eq!((told.action.as_str(), told.outcome.as_str()), ("accept", "replaced"));
        assert_eq!(told.fingerprint, Some(new.fingerprint().to_string()));
        assert_eq!(told.other_fingerprint, Some(old.fingerprint().to_string()));
        assert!(told.reason.unwrap().contains(&old.fingerprint().to_string()));
    }
}
