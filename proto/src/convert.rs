//! Conversions between the shared vocabulary (`pagewarden-types`) and the wire messages, each
//! once: integrity kinds and reject reasons (each pinned to its wire enum by the tests below),
//! a refusing status's details, sampling parameters (parsed by the same range check the router
//! applies, `SamplingParams::check`), cache events, finish reasons and request references. A value
//! the wire may carry but the vocabulary cannot name is an error (`INVALID_ARGUMENT`), never a
//! default.

use pagewarden_types::cache_event::{CacheEvent, CacheEventKind};
use pagewarden_types::integrity::IntegrityKind;
use pagewarden_types::reject_reason::RejectReason;
use pagewarden_types::sampling::{Grammar, SamplingParams};
use pagewarden_types::{AttemptId, FinishReason, RequestId};
use prost::Message;
use tonic::{Code, Status};

use crate::v1 as pb;
use crate::v1::sampling_params::Grammar as WireGrammar;

impl From<IntegrityKind> for pb::IntegrityKind {
    fn from(k: IntegrityKind) -> Self {
        match k {
            IntegrityKind::GenerationMismatch => pb::IntegrityKind::GenerationMismatch,
            IntegrityKind::ChecksumMismatch => pb::IntegrityKind::ChecksumMismatch,
            IntegrityKind::CountMismatch => pb::IntegrityKind::CountMismatch,
            IntegrityKind::GuardWordCorrupt => pb::IntegrityKind::GuardWordCorrupt,
            IntegrityKind::WriteRejected => pb::IntegrityKind::WriteRejected,
            IntegrityKind::Quarantine => pb::IntegrityKind::Quarantine,
            IntegrityKind::DeferredReleaseDrained => pb::IntegrityKind::DeferredReleaseDrained,
            IntegrityKind::DeferredReleaseTimedOut => pb::IntegrityKind::DeferredReleaseTimedOut,
            IntegrityKind::PreflightFailed => pb::IntegrityKind::PreflightFailed,
            IntegrityKind::PageNotWritten => pb::IntegrityKind::PageNotWritten,
            IntegrityKind::ManifestMismatch => pb::IntegrityKind::ManifestMismatch,
            IntegrityKind::StaleMessage => pb::IntegrityKind::StaleMessage,
        }
    }
}

/// The kind a wire value names; `None` for `UNSPECIFIED` and for values this build does not
/// know.
pub fn integrity_kind(v: i32) -> Option<IntegrityKind> {
    let wire = pb::IntegrityKind::try_from(v).ok()?;
    IntegrityKind::ALL
        .iter()
        .copied()
        .find(|k| pb::IntegrityKind::from(*k) == wire)
}

impl From<RejectReason> for pb::RejectReason {
    fn from(r: RejectReason) -> Self {
        match r {
            RejectReason::EmptyPrompt => pb::RejectReason::EmptyPrompt,
            RejectReason::ZeroMaxTokens => pb::RejectReason::ZeroMaxTokens,
            RejectReason::ContextLengthExceeded => pb::RejectReason::ContextLengthExceeded,
            RejectReason::QueueFull => pb::RejectReason::QueueFull,
            RejectReason::QueueTimeout => pb::RejectReason::QueueTimeout,
        }
    }
}

/// A worker's refusal of a request: `code` and `message`, with `reason` in the status's
/// details as `RejectDetails`.
pub fn rejected(code: Code, message: impl Into<String>, reason: RejectReason) -> Status {
    let details = pb::RejectDetails {
        reason: pb::RejectReason::from(reason) as i32,
    };
    Status::with_details(code, message, details.encode_to_vec().into())
}

/// Why a worker refused a request, from its status's details; `None` when the status carries
/// no `RejectDetails`, or a reason this build does not know.
pub fn reject_reason(status: &Status) -> Option<RejectReason> {
    let details = pb::RejectDetails::decode(status.details()).ok()?;
    let wire = pb::RejectReason::try_from(details.reason).ok()?;
    RejectReason::ALL
        .iter()
        .copied()
        .find(|r| pb::RejectReason::from(*r) == wire)
}

impl From<&CacheEvent> for pb::CacheReport {
    /// The event as the auditor's `ReportCache` takes it: the namespace as its tag, never its
    /// key.
    fn from(e: &CacheEvent) -> Self {
        let kind = match e.kind {
            CacheEventKind::Hit => pb::CacheEventKind::Hit,
            CacheEventKind::Miss => pb::CacheEventKind::Miss,
            CacheEventKind::Eviction => pb::CacheEventKind::Eviction,
            CacheEventKind::Held => pb::CacheEventKind::Held,
        };
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        pb::CacheReport {
            kind: kind as i32,
            node: e.node_id.clone(),
            role: e.role.to_string(),
            tenant: e
                .tenant
                .as_ref()
                .map(|t| t.as_str().to_string())
                .unwrap_or_default(),
            namespace: e.namespace.tag(),
            req: e.request.map(|r| request_ref(r, AttemptId(0))),
            prompt_tokens: count(e.prompt_tokens),
            cached_tokens: count(e.cached_tokens),
            pages: count(e.pages),
        }
    }
}

impl From<Option<FinishReason>> for pb::FinishReason {
    /// A token event's finish reason (`None`: the stream goes on). `ToolCalls` is the
    /// router's reading of a reply that stopped: `Stop` on the wire.
    fn from(f: Option<FinishReason>) -> Self {
        match f {
            None => pb::FinishReason::Unspecified,
            Some(FinishReason::Stop | FinishReason::ToolCalls) => pb::FinishReason::Stop,
            Some(FinishReason::Length) => pb::FinishReason::Length,
            Some(FinishReason::Abort) => pb::FinishReason::Abort,
        }
    }
}

/// Parses a token event's finish reason (`None`: the stream goes on).
pub fn finish_reason(v: i32) -> Result<Option<FinishReason>, Status> {
    match pb::FinishReason::try_from(v) {
        Ok(pb::FinishReason::Unspecified) => Ok(None),
        Ok(pb::FinishReason::Stop) => Ok(Some(FinishReason::Stop)),
        Ok(pb::FinishReason::Length) => Ok(Some(FinishReason::Length)),
        Ok(pb::FinishReason::Abort) => Ok(Some(FinishReason::Abort)),
        Err(_) => Err(Status::invalid_argument(format!(
            "finish: unknown finish reason {v}"
        ))),
    }
}

impl From<&SamplingParams> for pb::SamplingParams {
    /// The parameters for the wire: a repetition penalty of 1 (off) is absent, counts above
    /// `u32::MAX` saturate.
    fn from(s: &SamplingParams) -> Self {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        pb::SamplingParams {
            temperature: s.temperature,
            top_k: count(s.top_k),
            top_p: s.top_p,
            seed: s.seed,
            max_tokens: count(s.max_tokens),
            stop: s.stop.clone(),
            min_p: s.min_p,
            repetition_penalty: (s.repetition_penalty != 1.0).then_some(s.repetition_penalty),
            presence_penalty: s.presence_penalty,
            frequency_penalty: s.frequency_penalty,
            ignore_eos: s.ignore_eos,
            min_tokens: count(s.min_tokens),
            stop_token_ids: s.stop_token_ids.clone(),
            logprobs: s.logprobs.map(count),
            grammar: s.grammar.as_ref().map(|g| match g {
                Grammar::JsonObject => WireGrammar::JsonObject(true),
                Grammar::JsonSchema(schema) => WireGrammar::JsonSchema(schema.to_string()),
                Grammar::Regex(rx) => WireGrammar::Regex(rx.clone()),
                Grammar::Choice(choices) => WireGrammar::Choice(pb::Choices {
                    choices: choices.clone(),
                }),
            }),
            logit_bias: s.logit_bias.iter().copied().collect(),
            prompt_logprobs: s.prompt_logprobs.map(count),
        }
    }
}

/// Parses sampling parameters (required) and checks their ranges
/// ([`SamplingParams::check`], the router's rule): any error is `INVALID_ARGUMENT`.
pub fn sampling(s: Option<&pb::SamplingParams>) -> Result<SamplingParams, Status> {
    let s = s.ok_or_else(|| Status::invalid_argument("sampling is required"))?;
    let grammar = match &s.grammar {
        None => None,
        Some(WireGrammar::JsonObject(true)) => Some(Grammar::JsonObject),
        Some(WireGrammar::JsonObject(false)) => {
            return Err(Status::invalid_argument(
                "sampling.json_object: must be true when set",
            ))
        }
        Some(WireGrammar::JsonSchema(text)) => {
            Some(Grammar::JsonSchema(serde_json::from_str(text).map_err(
                |e| Status::invalid_argument(format!("sampling.json_schema: not JSON: {e}")),
            )?))
        }
        Some(WireGrammar::Regex(rx)) => Some(Grammar::Regex(rx.clone())),
        Some(WireGrammar::Choice(c)) => Some(Grammar::Choice(c.choices.clone())),
    };
    let mut logit_bias: Vec<(u32, f32)> = s.logit_bias.iter().map(|(&t, &b)| (t, b)).collect();
    logit_bias.sort_unstable_by_key(|&(t, _)| t);
    let params = SamplingParams {
        temperature: s.temperature,
        top_k: s.top_k as usize,
        top_p: s.top_p,
        seed: s.seed,
        max_tokens: s.max_tokens as usize,
        stop: s.stop.clone(),
        min_p: s.min_p,
        repetition_penalty: s.repetition_penalty.unwrap_or(1.0),
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        ignore_eos: s.ignore_eos,
        min_tokens: s.min_tokens as usize,
        stop_token_ids: s.stop_token_ids.clone(),
        logprobs: s.logprobs.map(|n| n as usize),
        grammar,
        logit_bias,
        prompt_logprobs: s.prompt_logprobs.map(|n| n as usize),
    };
    params
        .check()
        .map_err(|e| Status::invalid_argument(format!("sampling: {e}")))?;
    Ok(params)
}

/// A request attempt's reference for the wire (attempt 0: a report about the request as a
/// whole).
pub fn request_ref(req: RequestId, attempt: AttemptId) -> pb::RequestRef {
    pb::RequestRef {
        request_id: req.as_bytes().to_vec(),
        attempt: attempt.0,
    }
}

/// Parses a request reference.
pub fn parse_request_ref(r: Option<&pb::RequestRef>) -> Result<(RequestId, AttemptId), Status> {
    let r = r.ok_or_else(|| Status::invalid_argument("req is required"))?;
    let id = RequestId::from_bytes(&r.request_id)
        .ok_or_else(|| Status::invalid_argument("req.request_id must be 16 bytes"))?;
    Ok((id, AttemptId(r.attempt)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_integrity_kind_round_trips_and_keeps_its_wire_name() {
        for k in IntegrityKind::ALL {
            let wire = pb::IntegrityKind::from(*k);
            assert_eq!(integrity_kind(wire as i32), Some(*k));
            // INTEGRITY_KIND_COUNT_MISMATCH is count_mismatch: one spelling on both sides.
            let name = wire.as_str_name().to_ascii_lowercase();
            assert_eq!(name.strip_prefix("integrity_kind_"), Some(k.as_str()));
        }
        // Every wire value but UNSPECIFIED names a kind, so none can go unmapped.
        let mut v = 1;
        while pb::IntegrityKind::try_from(v).is_ok() {
            assert!(integrity_kind(v).is_some(), "wire value {v} names no kind");
            v += 1;
        }
        assert_eq!(v - 1, IntegrityKind::ALL.len() as i32);
        assert_eq!(integrity_kind(0), None);
        assert_eq!(integrity_kind(999), None);
    }

    #[test]
    fn every_reject_reason_round_trips_and_keeps_its_wire_name() {
        for r in RejectReason::ALL {
            let status = rejected(Code::ResourceExhausted, "refused", *r);
            assert_eq!(reject_reason(&status), Some(*r));
            assert_eq!(status.code(), Code::ResourceExhausted);
            assert_eq!(status.message(), "refused");
            // REJECT_REASON_QUEUE_FULL is queue_full: the metrics' label is the wire's name.
            let name = pb::RejectReason::from(*r)
                .as_str_name()
                .to_ascii_lowercase();
            assert_eq!(name.strip_prefix("reject_reason_"), Some(r.as_str()));
        }
        // Every wire value but UNSPECIFIED names a reason, so none can go unmapped.
        let mut v = 1;
        while pb::RejectReason::try_from(v).is_ok() {
            v += 1;
        }
        assert_eq!(v - 1, RejectReason::ALL.len() as i32);
    }

    #[test]
    fn a_status_without_known_reject_details_has_no_reason() {
        let details = |reason: i32| pb::RejectDetails { reason }.encode_to_vec().into();
        let unknown = [
            Status::invalid_argument("no details"),
            Status::with_details(Code::InvalidArgument, "x", details(0)),
            Status::with_details(Code::InvalidArgument, "x", details(999)),
            Status::with_details(Code::InvalidArgument, "x", vec![0xff, 0xff, 0xff].into()),
        ];
        for s in unknown {
            assert_eq!(reject_reason(&s), None, "{s:?}");
        }
    }

    #[test]
    fn finish_reasons_round_trip_and_unknown_ones_are_refused() {
        for f in [
            None,
            Some(FinishReason::Stop),
            Some(FinishReason::Length),
            Some(FinishReason::Abort),
        ] {
            assert_eq!(finish_reason(pb::FinishReason::from(f) as i32).unwrap(), f);
        }
        assert_eq!(
            pb::FinishReason::from(Some(FinishReason::ToolCalls)),
            pb::FinishReason::Stop
        );
        let err = finish_reason(42).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn request_refs_round_trip_and_short_ids_are_refused() {
        let id = RequestId([9; 16]);
        let r = request_ref(id, AttemptId(3));
        assert_eq!(parse_request_ref(Some(&r)).unwrap(), (id, AttemptId(3)));
        let short = pb::RequestRef {
            request_id: vec![1; 15],
            attempt: 0,
        };
        let e = parse_request_ref(Some(&short)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(e.message(), "req.request_id must be 16 bytes");
        assert_eq!(
            parse_request_ref(None).unwrap_err().message(),
            "req is required"
        );
    }
}
