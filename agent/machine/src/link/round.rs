//! A round's steps: the Diff answer read, checked and compared, what is
//! newer here pushed, what the node plans fetched and applied (see the
//! module documentation of `link.rs`).

use super::*;

#[derive(Debug)]
pub(super) struct RoundState {
    /// It may be left to the peer.
    pub(super) may_leave: bool,
    /// The connection or the timer started it: the timer is set again at its end.
    pub(super) timed: bool,
    /// The session's first.
    pub(super) first: bool,
    pub(super) step: Step,
    pub(super) report: Round,
}

#[derive(Debug)]
pub(super) enum Step {
    Digests,
    /// Reading the Diff answer (`None`: its first chunk is still to come).
    Reading {
        n_buckets: Option<usize>,
        pending: Summaries,
    },
    /// The node checks the buckets named (their summaries wait, and the
    /// bucket the answer brought) or compares a chunk.
    Checking {
        n_buckets: usize,
        pending: Summaries,
        ended: bool,
        first: Option<(Fetch, Vec<Decision>)>,
    },
    /// The node applies the bucket the Diff answer brought (the first
    /// chunk's summaries wait).
    ApplyingFirst {
        n_buckets: usize,
        pending: Summaries,
    },
    Ending {
        n_buckets: usize,
    },
    /// Loading what the node holds newer, to push (`empty`: in buckets
    /// where the peer holds nothing, pushed last).
    Pushing {
        rest: Vec<MinionId>,
        empty: Vec<MinionId>,
        n_lacked: usize,
    },
    NextIds,
    Fetching(Fetch),
    /// The ids after a fetch's, asked while its decisions wait to be applied.
    NextHolding {
        fetch: Fetch,
        decisions: Vec<Decision>,
    },
    /// The node applies the last fetch's decisions while this fetch travels.
    FetchingApplying(Fetch),
    /// The node applies the last fetch's decisions; nothing is left to fetch.
    Applying,
}

impl<B> Link<B> {
    pub(super) fn step(&mut self, input: Input<B>, peer_fetching: bool) {
        let Phase::Round(round) = &mut self.phase else {
            // An answer after the session failed is the driver's stale
            // message: nothing waits for it.
            if !matches!(self.phase, Phase::Down) {
                self.fault(Fault::Unexpected { got: input.name(), waiting: self.waiting() });
            }
            return;
        };
        let chunk = self.settings.compare_chunk;
        let step = std::mem::replace(&mut round.step, Step::Digests);
        match (step, input) {
            (Step::Digests, Input::Answer(Answer::Digests(digests))) => match digests {
                // Stale: out of contact for longer than tombstone_ttl, this
                // node offers nothing and asks for nothing until `rejoin`.
                None => self.end_round(false, None),
                Some(Asking { digests, empty }) => {
                    round.step = Step::Reading { n_buckets: None, pending: Vec::new() };
                    self.out.push_back(Out::Diff { digests, empty });
                }
            },
            (Step::Reading { n_buckets: None, .. }, Input::DiffChunk { buckets, summaries, whole, first }) => {
                if buckets.is_empty() && whole.is_empty() {
                    // Nothing differs (the driver took a bucket brought only as one of `whole`).
                    self.compared(0);
                } else {
                    let n_buckets = buckets.len() + whole.len();
                    round.step = Step::Checking { n_buckets, pending: summaries, ended: false, first };
                    self.out.push_back(Out::Call(Call::Begin { buckets, whole }));
                }
            }
            (Step::Reading { n_buckets: Some(_), .. }, Input::DiffChunk { buckets, whole, first, .. })
                if !buckets.is_empty() || !whole.is_empty() || first.is_some() =>
            {
                self.fault(BadAnswer::BucketsLate.into());
            }
            (Step::Reading { n_buckets: Some(n_buckets), mut pending }, Input::DiffChunk { summaries, .. }) => {
                pending.extend(summaries);
                if pending.len() >= chunk {
                    round.step = Step::Checking { n_buckets, pending: Vec::new(), ended: false, first: None };
                    self.out.push_back(Out::Call(Call::Compare(pending)));
                } else {
                    round.step = Step::Reading { n_buckets: Some(n_buckets), pending };
                    self.out.push_back(Out::ReadDiff);
                }
            }
            (Step::Reading { n_buckets, pending }, Input::DiffEnd) => match n_buckets {
                None => self.compared(0),
                Some(n_buckets) if pending.is_empty() => self.compared(n_buckets),
                Some(n_buckets) => {
                    round.step = Step::Checking { n_buckets, pending: Vec::new(), ended: true, first: None };
                    self.out.push_back(Out::Call(Call::Compare(pending)));
                }
            },
            (
                Step::Checking { n_buckets, pending, first: Some((fetch, decisions)), .. },
                Input::Answer(Answer::Checked(checked)),
            ) => {
                if let Err(e) = checked {
                    self.fault(e.into());
                } else {
                    // Applied as a fetch of it: the plan then drops the bucket.
                    round.step = Step::ApplyingFirst { n_buckets, pending };
                    self.out.push_back(Out::Call(Call::ApplyBrought { fetch, decisions }));
                }
            }
            (Step::ApplyingFirst { n_buckets, pending }, Input::Answer(Answer::Applied(n))) => {
                round.report.applied = round.report.applied.saturating_add(n);
                self.checked(n_buckets, pending);
            }
            (Step::Checking { n_buckets, pending, ended, first: None }, Input::Answer(Answer::Checked(checked))) => {
                if let Err(e) = checked {
                    self.fault(e.into());
                } else if ended {
                    self.compared(n_buckets);
                } else {
                    self.checked(n_buckets, pending);
                }
            }
            (Step::Ending { n_buckets }, Input::Answer(Answer::Compared(compared))) => match compared {
                Err(e) => self.fault(e.into()),
                Ok(Compared { n_newer_there, newer_here, newer_where_empty, full, whole }) => {
                    round.report = Round {
                        differing_buckets: n_buckets,
                        we_lacked: n_newer_there,
                        full,
                        whole,
                        // What the bucket the Diff answer brought applied.
                        applied: round.report.applied,
                        ..Round::default()
                    };
                    let n_lacked = newer_here.len() + newer_where_empty.len();
                    round.report.peer_lacked = n_lacked;
                    // Pushed in order, a chunk at a time: taken from the back.
                    let (mut rest, mut empty) = (newer_here, newer_where_empty);
                    rest.reverse();
                    empty.reverse();
                    round.step = Step::Pushing { rest, empty, n_lacked };
                    self.push_next(peer_fetching);
                }
            },
            (Step::Pushing { rest, empty, n_lacked }, Input::Answer(Answer::Loaded(mut decisions))) => {
                // Not what this session pushed already (on its way there).
                decisions.retain(|decision| self.sent.first(decision));
                round.report.pushed += decisions.len();
                round.step = Step::Pushing { rest, empty, n_lacked };
                if !decisions.is_empty() {
                    self.out.push_back(Out::PushLoaded(decisions));
                }
                self.push_next(peer_fetching);
            }
            (Step::NextIds, Input::Answer(Answer::Next(next))) => match next {
                Some(fetch) => {
                    round.step = Step::Fetching(fetch.clone());
                    self.out.push_back(Out::Fetch(fetch));
                }
                None => {
                    let report = round.report.clone();
                    self.fetched_all(report);
                }
            },
            // The next ids are asked before the decisions are applied (the
            // fetch's ids stay claimed meanwhile), so the next fetch travels
            // while the node writes these: a joining master's disk and its
            // peer's answers overlap instead of taking turns.
            (Step::Fetching(fetch), Input::Fetched(decisions)) => {
                round.step = Step::NextHolding { fetch, decisions };
                self.out.push_back(Out::Call(Call::Next));
            }
            (Step::NextHolding { fetch, decisions }, Input::Answer(Answer::Next(next))) => match next {
                Some(next) => {
                    round.step = Step::FetchingApplying(next.clone());
                    self.out.push_back(Out::FetchApplying { fetch: next, applying: fetch, decisions });
                }
                None => {
                    round.step = Step::Applying;
                    self.out.push_back(Out::Call(Call::Apply { fetch, decisions }));
                }
            },
            (Step::FetchingApplying(fetch), Input::Answer(Answer::Applied(n))) => {
                round.report.applied = round.report.applied.saturating_add(n);
                round.step = Step::Fetching(fetch);
            }
            // The last fetch's decisions, applied after the node said nothing
            // is left (it dropped the plan then: asking again finds nothing).
            (Step::Applying, Input::Answer(Answer::Applied(n))) => {
                round.report.applied = round.report.applied.saturating_add(n);
                let report = round.report.clone();
                self.fetched_all(report);
            }
            (step, input) => {
                let waiting = step.name();
                self.fault(Fault::Unexpected { got: input.name(), waiting });
            }
        }
    }

    /// The node's plan is done: the round ends (and the next comes soon if
    /// it was left, full, or brought something in whole buckets).
    fn fetched_all(&mut self, report: Round) {
        let soon = report.left || report.full || (report.whole > 0 && report.applied > 0);
        self.end_round(soon, Some(report));
    }

    /// A chunk of the Diff answer is checked or compared, and `pending`
    /// summaries of it wait: compared if a chunk's worth, else the next
    /// chunk is read.
    fn checked(&mut self, n_buckets: usize, pending: Summaries) {
        let Phase::Round(round) = &mut self.phase else { return };
        if pending.len() >= self.settings.compare_chunk {
            round.step = Step::Checking { n_buckets, pending: Vec::new(), ended: false, first: None };
            self.out.push_back(Out::Call(Call::Compare(pending)));
        } else {
            round.step = Step::Reading { n_buckets: Some(n_buckets), pending };
            self.out.push_back(Out::ReadDiff);
        }
    }

    /// The whole Diff answer is compared.
    fn compared(&mut self, n_buckets: usize) {
        self.out.push_back(Out::Call(Call::Contact));
        if n_buckets == 0 {
            self.out.push_back(Out::Call(Call::Agreed));
            self.end_round(false, Some(Round::default()));
            return;
        }
        if let Phase::Round(round) = &mut self.phase {
            round.step = Step::Ending { n_buckets };
        }
        self.out.push_back(Out::Call(Call::End));
    }

    /// Loads the next chunk to push, or asks what to fetch. A large push
    /// is left to the peer once it fetches from this node (both rounds
    /// began at once): its round brings it what differs. So is, whatever
    /// its size, the push of what it lacks in buckets where it holds
    /// nothing: a peer that asks for such buckets whole counts as fetching
    /// (a joining master), and its round fetches them from one peer.
    fn push_next(&mut self, peer_fetching: bool) {
        let push_chunk = self.settings.push_chunk;
        let Phase::Round(round) = &mut self.phase else { return };
        let Step::Pushing { rest, empty, n_lacked } = &mut round.step else { return };
        let left = round.may_leave && peer_fetching;
        if left && *n_lacked > push_chunk && !rest.is_empty() {
            round.report.left = true;
            rest.clear();
        }
        if left && !empty.is_empty() {
            round.report.left = true;
            empty.clear();
        }
        let next = if rest.is_empty() { empty } else { rest };
        if next.is_empty() {
            round.step = Step::NextIds;
            self.out.push_back(Out::Call(Call::Next));
            return;
        }
        let ids: Vec<MinionId> = next.drain(next.len().saturating_sub(push_chunk)..).rev().collect();
        self.out.push_back(Out::Call(Call::Load(ids)));
    }
}
