//! Building the `TokenEvent`s of a `Generate` stream, and the account its last one carries.

use pagewarden_common::{AttemptId, RequestId};
use pagewarden_kvcache::SharedPages;
use pagewarden_model::{Emitted, FinishReason, TokenLogprobs};
use pagewarden_proto::convert::request_ref;
use pagewarden_proto::v1::{self as pb, TokenEvent};
use pagewarden_worker::wire::{grant_page, logprobs as wire_logprobs, reused_runs};

use crate::state::Running;

/// One emitted token (or the end marker, which carries no logprobs: it is not part of the
/// completion).
pub fn token(
    req: RequestId,
    attempt: AttemptId,
    e: Emitted,
    logprobs: Option<TokenLogprobs>,
) -> TokenEvent {
    let logprobs = if e.end_of_generation {
        None
    } else {
        logprobs.as_ref().map(wire_logprobs)
    };
    TokenEvent {
        req: Some(request_ref(req, attempt)),
        token: e.token,
        text: e.text,
        finish: pb::FinishReason::from(e.finish) as i32,
        marker_only: e.end_of_generation,
        logprobs,
        account: None,
    }
}

/// What a sequence that ended with `finish` was computed over, for its last event: its page
/// table in token order (the pinned cached prefix, then its own pages: prompt pages prefill
/// wrote, generated-token pages, recomputed ones after a preemption), the runs of that prefix
/// with their producers, and its preemptions. `None` for an abort, which carries none.
pub fn account(finish: FinishReason, r: &Running) -> Option<pb::SequenceAccount> {
    match finish {
        FinishReason::Stop | FinishReason::Length | FinishReason::ToolCalls => {}
        FinishReason::Abort => return None,
    }
    let prefix = r.prefix.as_ref().map_or(&[][..], SharedPages::table);
    let pages = prefix
        .iter()
        .chain(r.pages.table())
        .map(|&entry| grant_page(entry))
        .collect();
    Some(pb::SequenceAccount {
        pages,
        reused: r.prefix.as_ref().map(reused_runs).unwrap_or_default(),
        preemptions: r.seq.preemptions,
    })
}

/// The last event of an aborted stream.
pub fn abort(req: RequestId, attempt: AttemptId) -> TokenEvent {
    TokenEvent {
        req: Some(request_ref(req, attempt)),
        token: 0,
        text: String::new(),
        finish: pb::FinishReason::from(Some(FinishReason::Abort)) as i32,
        marker_only: true,
        logprobs: None,
        account: None,
    }
}
