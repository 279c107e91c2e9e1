//! The parts of a request that prefill and decode parse alike, and the logprobs both send.
//! Malformed input becomes `INVALID_ARGUMENT` here, so nothing past the gRPC layer sees an
//! unparsed message.

use pagewarden_common::{AttemptId, RequestId};
use pagewarden_model::{Grammar, Logprob, SamplingParams, TokenLogprobs, MAX_TOP_LOGPROBS};
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

/// At most this many stop token ids (the router's limit too).
pub const MAX_STOP_TOKEN_IDS: usize = 64;

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
    let repetition_penalty = s.repetition_penalty.unwrap_or(1.0);
    let finite = [
        s.min_p,
        repetition_penalty,
        s.presence_penalty,
        s.frequency_penalty,
    ];
    if finite.iter().any(|x| !x.is_finite()) || !(0.0..=1.0).contains(&s.min_p) {
        return Err(Status::invalid_argument(
            "sampling: min_p must be in [0, 1] and every penalty finite",
        ));
    }
    if repetition_penalty <= 0.0 {
        return Err(Status::invalid_argument(
            "sampling.repetition_penalty must be > 0",
        ));
    }
    if s.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(Status::invalid_argument(format!(
            "sampling.stop_token_ids: at most {MAX_STOP_TOKEN_IDS}"
        )));
    }
    if s.logprobs.is_some_and(|n| n as usize > MAX_TOP_LOGPROBS) {
        return Err(Status::invalid_argument(format!(
            "sampling.logprobs: at most {MAX_TOP_LOGPROBS} top logprobs"
        )));
    }
    let grammar = match &s.grammar {
        None => None,
        Some(pb::sampling_params::Grammar::JsonObject(true)) => Some(Grammar::JsonObject),
        Some(pb::sampling_params::Grammar::JsonObject(false)) => {
            return Err(Status::invalid_argument(
                "sampling.json_object: must be true when set",
            ))
        }
        Some(pb::sampling_params::Grammar::JsonSchema(text)) => {
            Some(Grammar::JsonSchema(serde_json::from_str(text).map_err(
                |e| Status::invalid_argument(format!("sampling.json_schema: not JSON: {e}")),
            )?))
        }
    };
    Ok(SamplingParams {
        temperature: s.temperature,
        top_k: s.top_k as usize,
        top_p: s.top_p,
        seed: s.seed,
        max_tokens: s.max_tokens as usize,
        stop: s.stop.clone(),
        min_p: s.min_p,
        repetition_penalty,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        ignore_eos: s.ignore_eos,
        min_tokens: s.min_tokens as usize,
        stop_token_ids: s.stop_token_ids.clone(),
        logprobs: s.logprobs.map(|n| n as usize),
        grammar,
    })
}

/// The prompt's ids (see `ReserveRequest.prompt_token_ids`): exactly `prompt_tokens` of them.
/// Decode needs them to recompute a sequence preempted for pages (and a repetition penalty
/// counts them).
pub fn prompt_ids(ids: Vec<u32>, prompt_tokens: usize) -> Result<Vec<u32>, Status> {
    if ids.len() != prompt_tokens {
        return Err(Status::invalid_argument(format!(
            "prompt_token_ids: all {prompt_tokens} prompt ids are required, got {}",
            ids.len()
        )));
    }
    Ok(ids)
}

/// A token's logprobs for the wire.
pub fn logprobs(l: &TokenLogprobs) -> pb::Logprobs {
    let one = |l: &Logprob| pb::TokenLogprob {
        token: l.token,
        logprob: l.logprob,
    };
    pb::Logprobs {
        chosen: Some(one(&l.chosen)),
        top: l.top.iter().map(one).collect(),
    }
}

/// Parses a token's logprobs (absent stays absent).
pub fn parse_logprobs(l: Option<&pb::Logprobs>) -> Result<Option<TokenLogprobs>, Status> {
    let Some(l) = l else { return Ok(None) };
    let one = |l: &pb::TokenLogprob| {
        if l.logprob.is_nan() || l.logprob > 0.0 {
            return Err(Status::invalid_argument(
                "logprobs: a logprob must be a number <= 0",
            ));
        }
        Ok(Logprob {
            token: l.token,
            logprob: l.logprob,
        })
    };
    let chosen = l
        .chosen
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("logprobs.chosen is required"))?;
    if l.top.len() > MAX_TOP_LOGPROBS {
        return Err(Status::invalid_argument(format!(
            "logprobs.top: at most {MAX_TOP_LOGPROBS}"
        )));
    }
    Ok(Some(TokenLogprobs {
        chosen: one(chosen)?,
        top: l.top.iter().map(one).collect::<Result<_, _>>()?,
    }))
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
