//! How a link paces and bounds its rounds.

use std::time::Duration;

use crate::node::FETCH_CHUNK;

/// How a link paces and bounds its rounds.
#[derive(Clone, Debug)]
pub struct LinkSettings {
    /// Between two rounds.
    pub interval: Duration,
    /// A round left to the peer, or whose plan was full, is followed by
    /// the next this much later (or after `interval`, if sooner).
    pub again: Duration,
    /// Summaries of a Diff answer handed to the node at once.
    pub compare_chunk: usize,
    /// Ids loaded and pushed at once when the node holds them newer.
    pub push_chunk: usize,
    /// Added to `interval / 2` for the wait after a session's first round,
    /// below `interval`: the links of an agent connect together at its
    /// start, and the agents of a site after a network outage, so without
    /// it their rounds stay aligned and every link pauses at once.
    pub phase: Duration,
}

/// Summaries of a peer's Diff answer handed to the node at once (a few MiB).
pub const COMPARE_CHUNK: usize = 20_000;

impl LinkSettings {
    /// The agent's bounds, with its round interval and the time a peer
    /// counts as fetching after its last fetch.
    pub fn new(interval: Duration, fetching: Duration) -> LinkSettings {
        LinkSettings {
            interval,
            again: fetching.min(interval),
            compare_chunk: COMPARE_CHUNK,
            push_chunk: FETCH_CHUNK,
            phase: interval / 2,
        }
    }

    /// These settings with the phase `random` picks (any value, drawn at
    /// random by the driver) in `[0, interval)`.
    pub fn with_phase(self, random: u64) -> LinkSettings {
        let interval_ms = self.interval.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
        LinkSettings { phase: Duration::from_millis(random % interval_ms), ..self }
    }

    /// The wait after a session's first round: `interval / 2 + phase`.
    pub(super) fn after_first(&self) -> Duration {
        self.interval / 2 + self.phase.min(self.interval)
    }
}
