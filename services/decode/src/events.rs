//! Building the `TokenEvent`s of a `Generate` stream.

use pagewarden_common::{AttemptId, RequestId};
use pagewarden_model::{Emitted, FinishReason, TokenLogprobs};
use pagewarden_proto::convert::request_ref;
use pagewarden_proto::v1::{self as pb, TokenEvent};
use pagewarden_worker::wire::logprobs as wire_logprobs;

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
    }
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
    }
}
