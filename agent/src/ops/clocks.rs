//! Clocks compared through `Hello` (issue 28 item 4): a master stamps its
//! decisions with its hybrid clock, and a peer refuses one stamped further
//! ahead of its own wall clock than its `max_clock_skew`. Refused, the
//! decision is seen only in that peer's audit log; so each `Hello`, both
//! ways, carries the sender's wall clock, the stamp its next decision would
//! carry and its bound, and the receiver compares them with its own on
//! receipt. Both sides then know, and `status` says so on both: the master
//! whose decisions are refused (an error: they reach no peer) and the
//! masters refusing them. One comparison per peer is kept, the latest: a
//! few numbers, replaced at every `Hello` (each anti-entropy round).
//!
//! A message's travel time is not taken off: milliseconds, where the bound
//! is at least a second (5 minutes by default). What a peer says of its
//! clocks is its own word, like the rest of its `Hello`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ops::findings::{Finding, Level};

/// A master's clocks as its agent stamps decisions (see the proto's
/// `ClockReading`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockReading {
    /// Its wall clock, ms since the epoch.
    pub wall_ms: u64,
    /// The ms part of the version its next decision would carry.
    pub stamp_ms: u64,
    /// It refuses a peer's decision stamped further ahead of its wall clock.
    pub max_skew_ms: u64,
}

impl ClockReading {
    /// This agent's clocks now: `hlc` is its hybrid clock (the node's).
    pub fn now(hlc: u64, max_skew: Duration) -> ClockReading {
        let wall_ms = crate::node::wall_ms();
        ClockReading {
            wall_ms,
            stamp_ms: wall_ms.max(hlc >> keysync_machine::core::version::LOGICAL_BITS),
            max_skew_ms: u64::try_from(max_skew.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// One peer's clocks against this master's, as its last `Hello` told them
/// (`status --json`: `peers[].clock`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerClock {
    /// When they were compared (RFC 3339).
    pub at: String,
    /// The peer's wall clock minus this master's, ms (positive: ahead).
    pub offset_ms: i64,
    /// How far ahead of this master's wall clock the peer stamps its
    /// decisions now, ms (negative: behind).
    pub peer_stamps_ahead_ms: i64,
    /// How far ahead of the peer's wall clock this master stamps its
    /// decisions now, ms.
    pub our_stamps_ahead_ms: i64,
    /// This master's `max_clock_skew`, ms.
    pub max_skew_ms: u64,
    /// The peer's, ms.
    pub peer_max_skew_ms: u64,
    /// This master refuses the peer's decisions: stamped further ahead
    /// than its `max_clock_skew`.
    pub refused_here: bool,
    /// The peer refuses this master's decisions.
    pub refuses_ours: bool,
}

fn signed(a: u64, b: u64) -> i64 {
    i64::try_from(i128::from(a) - i128::from(b)).unwrap_or(if a > b { i64::MAX } else { i64::MIN })
}

/// Compares the peer's reading with this master's (`ours`, taken on
/// receipt).
pub fn compare(theirs: ClockReading, ours: ClockReading) -> PeerClock {
    let peer_stamps_ahead_ms = signed(theirs.stamp_ms, ours.wall_ms);
    let our_stamps_ahead_ms = signed(ours.stamp_ms, theirs.wall_ms);
    PeerClock {
        at: crate::disk::audit::now_rfc3339(),
        offset_ms: signed(theirs.wall_ms, ours.wall_ms),
        peer_stamps_ahead_ms,
        our_stamps_ahead_ms,
        max_skew_ms: ours.max_skew_ms,
        peer_max_skew_ms: theirs.max_skew_ms,
        refused_here: peer_stamps_ahead_ms > 0 && peer_stamps_ahead_ms.unsigned_abs() > ours.max_skew_ms,
        refuses_ours: our_stamps_ahead_ms > 0 && our_stamps_ahead_ms.unsigned_abs() > theirs.max_skew_ms,
    }
}

/// `12s`, `10m`, `1h 30m`: whole seconds (`<1s` below one).
fn span(ms: u64) -> String {
    if ms < 1000 {
        return "<1s".into();
    }
    humantime::format_duration(Duration::from_secs(ms / 1000)).to_string()
}

/// Why a master stamps its decisions ahead: its wall clock (offset by
/// `wall_ahead_ms` from the others'), or its hybrid clock alone, which ran
/// ahead before and is kept in its store.
fn why(who: &str, wall_ahead_ms: i64, stamps_ahead_ms: i64, max_skew_ms: u64, fix_here: bool) -> String {
    // The wall clock explains the stamps unless it is within the bound.
    if wall_ahead_ms > 0 && wall_ahead_ms.unsigned_abs() > max_skew_ms {
        let fix =
            if fix_here { "check its time synchronisation (NTP)" } else { "check the time synchronisation there" };
        return format!(
            "{who}'s wall clock reads {} ahead: {fix}, or the other side's if that one is behind",
            span(wall_ahead_ms.unsigned_abs())
        );
    }
    let way_out = if fix_here {
        "stop its agent and run `salt-keysync recover --from-peers --force` (\"A clock far off\" in /usr/share/doc/salt-keysync/recovery.md)"
    } else {
        "or `salt-keysync recover --from-peers --force` there ends it (\"A clock far off\" in /usr/share/doc/salt-keysync/recovery.md)"
    };
    format!(
        "{who}'s wall clock agrees, but its hybrid clock ran ahead earlier and its store keeps it: its decisions \
         are stamped ahead until real time catches up ({} from now); {way_out}",
        span(stamps_ahead_ms.unsigned_abs().saturating_sub(max_skew_ms))
    )
}

/// The findings about clocks (kind `clock`, errors): each peer whose
/// decisions this master refuses for its clock, and, as one finding, the
/// peers that refuse this master's. `peers`: each peer's last comparison.
pub fn clock_findings(this_node: &str, peers: &[(&str, &PeerClock)]) -> Vec<Finding> {
    let mut found = Vec::new();
    for (peer, clock) in peers.iter().filter(|(_, c)| c.refused_here) {
        found.push(Finding {
            level: Level::Error,
            kind: "clock".into(),
            masters: vec![peer.to_string()],
            message: format!(
                "{peer}'s decisions are refused here: it stamps them {} ahead of this master's clock, past \
                 max_clock_skew ({}); {}",
                span(clock.peer_stamps_ahead_ms.unsigned_abs()),
                span(clock.max_skew_ms),
                why(peer, clock.offset_ms, clock.peer_stamps_ahead_ms, clock.max_skew_ms, false)
            ),
        });
    }
    let refusing: Vec<&(&str, &PeerClock)> = peers.iter().filter(|(_, c)| c.refuses_ours).collect();
    if let Some((_, worst)) = refusing.iter().max_by_key(|(_, c)| c.our_stamps_ahead_ms) {
        let names: Vec<&str> = refusing.iter().map(|(name, _)| *name).collect();
        found.push(Finding {
            level: Level::Error,
            kind: "clock".into(),
            masters: std::iter::once(this_node).chain(names.iter().copied()).map(str::to_string).collect(),
            message: if refusing.len() < peers.len() {
                // Other peers take them: the refusing ones are more likely behind.
                format!(
                    "this master's decisions are refused by {}: it stamps them up to {} ahead of their clocks, past \
                     their max_clock_skew ({}), while the other peers take them, so the clocks of {} are more \
                     likely behind: check their time synchronisation (NTP) first",
                    names.join(", "),
                    span(worst.our_stamps_ahead_ms.unsigned_abs()),
                    span(worst.peer_max_skew_ms),
                    names.join(", ")
                )
            } else {
                format!(
                    "this master's decisions are refused by {}: it stamps them up to {} ahead of their clocks, past \
                     their max_clock_skew ({}), so they reach no peer until real time catches up; {}",
                    names.join(", "),
                    span(worst.our_stamps_ahead_ms.unsigned_abs()),
                    span(worst.peer_max_skew_ms),
                    why("this master", -worst.offset_ms, worst.our_stamps_ahead_ms, worst.peer_max_skew_ms, true)
                )
            },
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;
    const MINUTE: u64 = 60_000;

    fn reading(wall_ms: u64, stamp_ms: u64) -> ClockReading {
        ClockReading { wall_ms, stamp_ms, max_skew_ms: 5 * MINUTE }
    }

    /// master-a's clock runs 10 minutes ahead: master-b refuses its
    /// decisions and says so, and master-a, comparing the other way, says
    /// that master-b refuses them.
    #[test]
    fn a_clock_ahead_is_an_error_on_both_sides() {
        let (a, b) = (reading(NOW + 10 * MINUTE, NOW + 10 * MINUTE), reading(NOW, NOW));
        let on_b = compare(a, b);
        assert!(on_b.refused_here && !on_b.refuses_ours, "{on_b:?}");
        assert_eq!((on_b.offset_ms, on_b.peer_stamps_ahead_ms), (600_000, 600_000));
        let found = clock_findings("master-b", &[("master-a", &on_b)]);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].level, found[0].kind.as_str(), found[0].masters.as_slice()),
            (Level::Error, "clock", &["master-a".to_string()][..])
        );
        assert_eq!(
            found[0].message,
            "master-a's decisions are refused here: it stamps them 10m ahead of this master's clock, past \
             max_clock_skew (5m); master-a's wall clock reads 10m ahead: check the time synchronisation there, or \
             the other side's if that one is behind"
        );

        let on_a = compare(b, a);
        assert!(!on_a.refused_here && on_a.refuses_ours, "{on_a:?}");
        let c = compare(reading(NOW + 2_000, NOW + 2_000), a);
        let found = clock_findings("master-a", &[("master-b", &on_a), ("master-c", &c)]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].masters, ["master-a", "master-b", "master-c"]);
        assert_eq!(
            found[0].message,
            "this master's decisions are refused by master-b, master-c: it stamps them up to 10m ahead of their \
             clocks, past their max_clock_skew (5m), so they reach no peer until real time catches up; this \
             master's wall clock reads 10m ahead: check its time synchronisation (NTP), or the other side's if that \
             one is behind"
        );
    }

    /// master-a and master-c agree, master-b runs 10 minutes behind: on
    /// master-a only master-b refuses its decisions, and the finding points
    /// at master-b's clock, not at master-a's (an independent review found
    /// the right master told to fix its NTP).
    #[test]
    fn a_peer_behind_is_named_when_the_others_agree() {
        let (a, b, c) = (reading(NOW, NOW), reading(NOW - 10 * MINUTE, NOW - 10 * MINUTE), reading(NOW, NOW));
        let (from_b, from_c) = (compare(b, a), compare(c, a));
        assert!(from_b.refuses_ours && !from_c.refuses_ours);
        let found = clock_findings("master-a", &[("master-b", &from_b), ("master-c", &from_c)]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].message.ends_with(
                "while the other peers take them, so the clocks of master-b are more likely behind: check their \
                 time synchronisation (NTP) first"
            ),
            "{found:?}"
        );
    }

    /// Time synchronised again, the hybrid clock still runs ahead (kept in
    /// the store): the finding names the way out instead of NTP.
    #[test]
    fn a_hybrid_clock_ahead_of_a_right_wall_clock_names_the_recovery() {
        let (a, b) = (reading(NOW, NOW + 8 * MINUTE), reading(NOW, NOW));
        let found = clock_findings("master-a", &[("master-b", &compare(b, a))]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].message.contains("it stamps them up to 8m ahead"), "{found:?}");
        assert!(
            found[0].message.ends_with(
                "this master's wall clock agrees, but its hybrid clock ran ahead earlier and its store keeps it: its \
                 decisions are stamped ahead until real time catches up (3m from now); stop its agent and run \
                 `salt-keysync recover --from-peers --force` (\"A clock far off\" in /usr/share/doc/salt-keysync/recovery.md)"
            ),
            "{found:?}"
        );
    }

    /// Within the bound either way: nothing refused, no finding. A peer
    /// far behind refuses this master's decisions (relative to it, this
    /// master is ahead). Absurd numbers from a peer do not overflow.
    #[test]
    fn within_the_bound_is_no_finding_and_absurd_numbers_do_not_overflow() {
        let ours = reading(NOW, NOW);
        for theirs in [reading(NOW + 4 * MINUTE, NOW + 4 * MINUTE), reading(NOW - 4 * MINUTE, NOW - 4 * MINUTE)] {
            let clock = compare(theirs, ours);
            assert!(!clock.refused_here && !clock.refuses_ours, "{clock:?}");
            assert!(clock_findings("master-a", &[("master-b", &clock)]).is_empty());
        }
        let behind = compare(reading(NOW - 60 * MINUTE, NOW - 60 * MINUTE), ours);
        assert!(!behind.refused_here && behind.refuses_ours, "{behind:?}");
        let wild = compare(ClockReading { wall_ms: u64::MAX, stamp_ms: u64::MAX, max_skew_ms: 0 }, ours);
        assert!(wild.refused_here && wild.offset_ms == i64::MAX, "{wild:?}");
        assert!(!clock_findings("master-a", &[("master-b", &wild)]).is_empty());
    }
}
