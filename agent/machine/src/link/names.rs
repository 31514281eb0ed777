//! Names of a link's steps and inputs, for the faults a driver's mistake
//! raises ("the link got … while …").

use super::{Answer, Input, Step};

impl Step {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Step::Digests => "waiting for the digests",
            Step::Reading { .. } => "reading the Diff answer",
            Step::Checking { .. } => "comparing",
            Step::Ending { .. } => "ending the comparison",
            Step::Pushing { .. } => "loading decisions to push",
            Step::NextIds => "waiting for the ids to fetch",
            Step::Fetching(_) => "fetching",
            Step::NextHolding { .. } => "waiting for the ids to fetch while holding a fetch's decisions",
            Step::FetchingApplying(_) => "fetching while applying",
            Step::ApplyingFirst { .. } => "applying the bucket the Diff answer brought",
            Step::Applying => "applying",
        }
    }
}

impl<B> Input<B> {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Input::Connected => "Connected",
            Input::HelloDone => "HelloDone",
            Input::Due => "Due",
            Input::Outgoing { .. } => "Outgoing",
            Input::Lagged => "Lagged",
            Input::Answer(Answer::Digests(_)) => "the digests",
            Input::Answer(Answer::Checked(_)) => "a check",
            Input::Answer(Answer::Compared(_)) => "a comparison",
            Input::Answer(Answer::Loaded(_)) => "loaded decisions",
            Input::Answer(Answer::Next(_)) => "ids to fetch",
            Input::Answer(Answer::Applied(_)) => "an apply's count",
            Input::DiffChunk { .. } => "a Diff chunk",
            Input::DiffEnd => "the Diff's end",
            Input::Fetched(_) => "fetched decisions",
            Input::Failed => "Failed",
        }
    }
}
