//! The parts of a request that prefill and decode parse alike. Malformed input becomes
//! `INVALID_ARGUMENT` here, so nothing past the gRPC layer sees an unparsed message.

use pagewarden_common::{AttemptId, RequestId};
use pagewarden_model::SamplingParams;
use pagewarden_proto::v1 as pb;
use tonic::Status;

/// Parses a request reference.
pub fn request_ref(r: Option<&pb::RequestRef>) -> Result<(RequestId, AttemptId), Status> {
    let r = r.ok_or_else(|| Status::invalid_argument("req is required"))?;
    let id = RequestId::from_bytes(&r.request_id)
        .ok_or_else(|| Status::invalid_argument("req.request_id must be 16 bytes"))?;
    Ok((id, AttemptId(r.attempt)))
}

/// At most this many stop sequences (the router's limit too).
pub const MAX_STOP: usize = 16;
/// Longest stop sequence in bytes (the router's limit too).
pub const MAX_STOP_BYTES: usize = 256;

/// Parses sampling parameters.
pub fn sampling(s: Option<&pb::SamplingParams>) -> Result<SamplingParams, Status> {
    let s = s.ok_or_else(|| Status::invalid_argument("sampling is required"))?;
    if !s.temperature.is_finite() || s.temperature < 0.0 {
        return Err(Status::invalid_argument(
            "sampling.temperature must be >= 0",
        ));
    }
    if !(s.top_p > 0.0 && s.top_p <= 1.0) {
        return Err(Status::invalid_argument("sampling.top_p must be in (0, 1]"));
    }
    if s.stop.len() > MAX_STOP || s.stop.iter().any(|x| x.len() > MAX_STOP_BYTES) {
        return Err(Status::invalid_argument(format!(
            "sampling.stop: at most {MAX_STOP} sequences of at most {MAX_STOP_BYTES} bytes"
        )));
    }
    Ok(SamplingParams {
        temperature: s.temperature,
        top_k: s.top_k as usize,
        top_p: s.top_p,
        seed: s.seed,
        max_tokens: s.max_tokens as usize,
        stop: s.stop.clone(),
    })
}

/// Why a request that fits the context was refused after all: the wait for pages or compute is
/// bounded in length and in time. On the wire: `RESOURCE_EXHAUSTED` with `pagewarden-reason`
/// `queue_full` or `queue_timeout` (the router answers 503 with `Retry-After`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueRefusal {
    /// `limit` requests already wait.
    Full {
        /// The configured bound (`--max-queue`).
        limit: usize,
    },
    /// The request waited its whole `--queue-timeout-ms`.
    Timeout {
        /// The configured bound.
        waited: std::time::Duration,
    },
}

impl QueueRefusal {
    /// Label for metrics and the `pagewarden-reason` metadata.
    pub fn reason(self) -> &'static str {
        match self {
            QueueRefusal::Full { .. } => "queue_full",
            QueueRefusal::Timeout { .. } => "queue_timeout",
        }
    }

    /// The wire status; `role` names the worker in the message.
    pub fn status(self, role: &str) -> Status {
        let message = match self {
            QueueRefusal::Full { limit } => {
                format!("{role} queue full: {limit} requests already wait for KV pages")
            }
            QueueRefusal::Timeout { waited } => {
                format!("{role} queue deadline passed: waited {waited:?} for KV pages")
            }
        };
        let mut s = Status::resource_exhausted(message);
        if let Ok(v) = self.reason().parse() {
            s.metadata_mut().insert("pagewarden-reason", v);
        }
        s
    }
}
