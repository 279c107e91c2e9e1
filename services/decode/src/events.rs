//! Building the `TokenEvent`s of a `Generate` stream.

use pagewarden_common::{AttemptId, RequestId};
use pagewarden_model::TokenLogprobs;
use pagewarden_proto::v1::{FinishReason, RequestRef, TokenEvent};

use crate::output::{Emitted, Finish};

/// The wire reference of a request attempt.
pub fn request_ref(req: RequestId, attempt: AttemptId) -> RequestRef {
    RequestRef {
        request_id: req.as_bytes().to_vec(),
        attempt: attempt.0,
    }
}

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
        logprobs.as_ref().map(pagewarden_worker::wire::logprobs)
    };
    let finish = match e.finish {
        None => FinishReason::Unspecified,
        Some(Finish::Stop) => FinishReason::Stop,
        Some(Finish::Length) => FinishReason::Length,
    };
    TokenEvent {
        req: Some(request_ref(req, attempt)),
        token: e.token,
        text: e.text,
        finish: finish as i32,
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
        finish: FinishReason::Abort as i32,
        marker_only: true,
        logprobs: None,
    }
}
