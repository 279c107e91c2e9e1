//! Every way a router request can fail, classified once, and the one mapping from a failure to an
//! HTTP status and an OpenAI-shaped error body (TGI `server.rs` shape).

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagewarden_common::reject_reason::RejectReason;
use pagewarden_model::SamplingError;
use pagewarden_proto::convert::reject_reason;
use serde::Serialize;

/// Which half of the disaggregated pair a worker error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// A prefill worker.
    Prefill,
    /// A decode worker.
    Decode,
}

impl Half {
    /// Lower-case name for logs, metrics and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Half::Prefill => "prefill",
            Half::Decode => "decode",
        }
    }
}

/// A request parameter the client got wrong, with a message written for the client.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValidationError {
    /// The offending field, as the client spelled it (`max_tokens`, `messages[2].role`).
    pub param: String,
    /// What is wrong, naming the field.
    pub message: String,
}

impl ValidationError {
    /// An error about `param`; the message should name the field.
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: param.into(),
            message: message.into(),
        }
    }
}

impl From<SamplingError> for ValidationError {
    /// A sampling parameter out of range, named as the rule names it.
    fn from(e: SamplingError) -> Self {
        let message = e.to_string();
        ValidationError::new(e.param, message)
    }
}

/// Why the router refused or failed a request.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// No API key, or one that maps to no tenant.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// The body is larger than `--max-body-bytes`.
    #[error("request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// The body is not valid UTF-8.
    #[error("request body is not valid UTF-8: {0}")]
    InvalidUtf8(String),
    /// The body is not valid JSON (or not a JSON object, or repeats a key).
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    /// The body's `Content-Type` is not JSON.
    #[error("request body must be JSON (`Content-Type: application/json`), not {0}")]
    UnsupportedMediaType(String),
    /// A parameter is missing, of the wrong type or out of range.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The request names a model this router does not serve.
    #[error("the model `{0}` does not exist; see GET /v1/models")]
    ModelNotFound(String),
    /// prompt + max_tokens exceeds the effective context (I3).
    #[error("{message}")]
    ContextLengthExceeded {
        /// The parameter to blame: the prompt field when the prompt alone does not fit.
        param: &'static str,
        /// Client-facing message with the numbers.
        message: String,
    },
    /// The router's own concurrency limit is reached.
    #[error("the router is at its concurrency limit of {0} requests; retry later")]
    Overloaded(usize),
    /// The tenant has as many requests in flight as its limit allows.
    #[error(
        "tenant `{tenant}` has {limit} requests in flight, its limit; retry when one finishes"
    )]
    TenantOverloaded {
        /// The tenant.
        tenant: String,
        /// Its limit.
        limit: usize,
    },
    /// The tenant used its tokens per minute (prompt and completion tokens).
    #[error(
        "tenant `{tenant}` is over its limit of {per_minute} tokens per minute; retry in \
         {retry_after:.1?}"
    )]
    TokenRateExceeded {
        /// The tenant.
        tenant: String,
        /// Its limit.
        per_minute: u64,
        /// When its bucket holds this request's prompt again.
        retry_after: Duration,
    },
    /// No live decode or no live prefill worker.
    #[error("no live {0} worker; retry later")]
    NoLiveWorkers(&'static str),
    /// A worker has no free KV pages for this request now.
    #[error("the {half} worker's KV pool is exhausted: {message}", half = .half.as_str())]
    PoolExhausted {
        /// Which half refused.
        half: Half,
        /// The worker's message.
        message: String,
    },
    /// A worker refused the request as invalid (it re-checks admission).
    #[error("the {half} worker rejected the request: {message}", half = .half.as_str())]
    WorkerRejected {
        /// Which half refused.
        half: Half,
        /// The worker's message.
        message: String,
    },
    /// A worker failed or broke the protocol.
    #[error("the {half} worker failed: {message}", half = .half.as_str())]
    Worker {
        /// Which half failed.
        half: Half,
        /// What happened.
        message: String,
    },
    /// A worker did not confirm the erasure of the tenant's prefix cache (`DELETE /v1/cache`).
    #[error(
        "the cache erasure is incomplete: the {half} worker {worker} did not confirm it \
         ({message}){more}; the workers that answered have erased, and erasing again is \
         harmless: retry",
        half = .half.as_str(),
        more = if *.others > 0 { format!(", nor did {} other worker(s)", .others) } else { String::new() }
    )]
    EraseIncomplete {
        /// Its half.
        half: Half,
        /// Its node id and URL (or URL alone, when no poll has told its id).
        worker: String,
        /// Why.
        message: String,
        /// How many other workers did not confirm either.
        others: usize,
    },
    /// The request ran past `--request-timeout`.
    #[error("the request did not finish within {0:?}")]
    Timeout(Duration),
    /// A receipt was asked for and the router has no receipt key.
    #[error(
        "this deployment signs no isolation receipts (its router has no receipt key): ask \
         without X-Pagewarden-Receipt, or have the operator set receipt_key"
    )]
    ReceiptsNotConfigured,
    /// The route does not exist.
    #[error("no route for {0}")]
    NotFound(String),
    /// An OpenAI API this deployment does not serve.
    #[error(
        "this deployment serves no {0} API: it generates text at /v1/completions and \
         /v1/chat/completions (GET /v1/models names its model)"
    )]
    ApiNotServed(&'static str),
    /// The route exists but not for this HTTP method.
    #[error("{0} is not allowed on this route")]
    MethodNotAllowed(String),
    /// A bug in the router; never expected.
    #[error("internal error: {0}")]
    Internal(String),
}

/// OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct ErrorBody {
    /// The error itself.
    pub error: ErrorDetail,
}

/// The inside of [`ErrorBody`].
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct ErrorDetail {
    /// Human-readable, names the field when a field is to blame.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The offending parameter, if any.
    pub param: Option<String>,
    /// A stable machine-readable code, if any.
    pub code: Option<String>,
}

/// How long a client should wait before retrying a 429/503.
pub const RETRY_AFTER_SECS: u64 = 1;

impl RouterError {
    /// The one classification: status, OpenAI type, code and param.
    fn classify(
        &self,
    ) -> (
        StatusCode,
        &'static str,
        Option<&'static str>,
        Option<String>,
    ) {
        use RouterError as E;
        const BAD: &str = "invalid_request_error";
        match self {
            E::Unauthorized(_) => (
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                Some("invalid_api_key"),
                None,
            ),
            E::PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                BAD,
                Some("payload_too_large"),
                None,
            ),
            E::InvalidUtf8(_) => (StatusCode::BAD_REQUEST, BAD, Some("invalid_utf8"), None),
            E::InvalidJson(_) => (StatusCode::BAD_REQUEST, BAD, Some("invalid_json"), None),
            E::UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                BAD,
                Some("unsupported_media_type"),
                None,
            ),
            E::Invalid(v) => (
                StatusCode::BAD_REQUEST,
                BAD,
                Some("invalid_value"),
                Some(v.param.clone()),
            ),
            E::ReceiptsNotConfigured => (
                StatusCode::BAD_REQUEST,
                BAD,
                Some("receipts_not_configured"),
                None,
            ),
            E::ModelNotFound(_) => (
                StatusCode::NOT_FOUND,
                BAD,
                Some("model_not_found"),
                Some("model".into()),
            ),
            E::ContextLengthExceeded { param, .. } => (
                StatusCode::BAD_REQUEST,
                BAD,
                Some("context_length_exceeded"),
                Some((*param).into()),
            ),
            E::Overloaded(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                Some("rate_limit_exceeded"),
                None,
            ),
            E::TenantOverloaded { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                Some("tenant_limit_exceeded"),
                None,
            ),
            E::TokenRateExceeded { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                Some("tokens_per_minute_exceeded"),
                None,
            ),
            E::NoLiveWorkers(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                Some("no_live_workers"),
                None,
            ),
            E::PoolExhausted { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                Some("kv_pool_exhausted"),
                None,
            ),
            E::WorkerRejected { .. } => (
                StatusCode::BAD_REQUEST,
                BAD,
                Some("rejected_by_worker"),
                None,
            ),
            E::Worker { .. } => (
                StatusCode::BAD_GATEWAY,
                "server_error",
                Some("worker_failed"),
                None,
            ),
            E::EraseIncomplete { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                Some("erasure_incomplete"),
                None,
            ),
            E::Timeout(_) => (
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                Some("timeout"),
                None,
            ),
            E::NotFound(_) => (StatusCode::NOT_FOUND, BAD, Some("not_found"), None),
            E::ApiNotServed(_) => (StatusCode::NOT_FOUND, BAD, Some("api_not_served"), None),
            E::MethodNotAllowed(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                BAD,
                Some("method_not_allowed"),
                None,
            ),
            E::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                None,
            ),
        }
    }

    /// The HTTP status this error maps to.
    pub fn status(&self) -> StatusCode {
        self.classify().0
    }

    /// `Some(seconds)` for the over-capacity errors that carry `Retry-After`.
    pub fn retry_after(&self) -> Option<u64> {
        if let RouterError::TokenRateExceeded { retry_after, .. } = self {
            // Whole seconds, rounded up: a client retrying on time is admitted.
            return Some(retry_after.as_secs_f64().ceil().max(1.0) as u64);
        }
        match self.status() {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                Some(RETRY_AFTER_SECS)
            }
            _ => None,
        }
    }

    /// Label for `pagewarden_router_rejections_total{reason}` and logs.
    pub fn reason(&self) -> &'static str {
        self.classify().2.unwrap_or("internal")
    }

    /// The OpenAI error body.
    pub fn body(&self) -> ErrorBody {
        let (_, kind, code, param) = self.classify();
        ErrorBody {
            error: ErrorDetail {
                message: truncated(self.to_string(), MAX_MESSAGE_BYTES),
                kind: kind.into(),
                param: param.map(|p| truncated(p, MAX_PARAM_BYTES)),
                code: code.map(Into::into),
            },
        }
    }
}

/// Longest error message sent back: a message may quote the client's own value, which may be
/// megabytes long.
pub const MAX_MESSAGE_BYTES: usize = 1024;
const MAX_PARAM_BYTES: usize = 128;

/// `s` cut to at most `max` bytes (on a character boundary), saying how much was cut.
pub fn truncated(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes not shown)", &s[..end], s.len() - end)
}

impl From<&RouterError> for (StatusCode, Json<ErrorBody>) {
    fn from(e: &RouterError) -> Self {
        (e.status(), Json(e.body()))
    }
}

impl From<RouterError> for (StatusCode, Json<ErrorBody>) {
    fn from(e: RouterError) -> Self {
        (&e).into()
    }
}

impl IntoResponse for RouterError {
    fn into_response(self) -> Response {
        let retry = self.retry_after();
        let mut resp = <(StatusCode, Json<ErrorBody>)>::from(&self).into_response();
        if let Some(secs) = retry {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// Maps a worker's gRPC status to a router error, classified once here.
pub fn from_status(half: Half, status: &tonic::Status) -> RouterError {
    use tonic::Code;
    let message = status.message().to_string();
    if reject_reason(status) == Some(RejectReason::ContextLengthExceeded) {
        // The worker's own admission check (defense in depth) disagreed with ours, e.g. it
        // lowered its context since the last poll: still the client-facing 400.
        return RouterError::ContextLengthExceeded {
            param: "prompt",
            message: format!("the {} worker: {message}", half.as_str()),
        };
    }
    match status.code() {
        Code::ResourceExhausted => RouterError::PoolExhausted { half, message },
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
            RouterError::WorkerRejected { half, message }
        }
        Code::Ok
        | Code::Cancelled
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::Aborted
        | Code::Unimplemented
        | Code::Internal
        | Code::Unavailable
        | Code::DataLoss
        | Code::Unauthenticated => RouterError::Worker {
            half,
            message: format!("{:?}: {message}", status.code()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewarden_proto::convert::rejected;
    use tonic::{Code, Status};

    /// A worker's own context refusal is the client's 400 whatever its code; other reasons and
    /// statuses without details are classified by their code.
    #[test]
    fn a_worker_context_refusal_is_the_clients_400_and_other_statuses_go_by_code() {
        let over = rejected(
            Code::InvalidArgument,
            "too long",
            RejectReason::ContextLengthExceeded,
        );
        let e = from_status(Half::Prefill, &over);
        assert!(
            matches!(
                e,
                RouterError::ContextLengthExceeded {
                    param: "prompt",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(e.to_string(), "the prefill worker: too long");

        let full = rejected(Code::ResourceExhausted, "full", RejectReason::QueueFull);
        assert!(matches!(
            from_status(Half::Decode, &full),
            RouterError::PoolExhausted { .. }
        ));
        let plain = Status::invalid_argument("too long");
        assert!(matches!(
            from_status(Half::Decode, &plain),
            RouterError::WorkerRejected { .. }
        ));
    }
}
