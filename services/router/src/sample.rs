//! The auditor's hook: every finished response is offered to a [`SampleSink`], every
//! prefix-cache erasure's certificate told to it, and the choices picked for the recompute
//! audit handed to it; the default does nothing. The launcher wires
//! the auditor's client in.

use std::time::Duration;

use pagewarden_common::{RequestId, TenantId};

use crate::erasure::CacheErasure;

/// One finished response, as the auditor scans it for other tenants' canary markers.
#[derive(Clone, Debug)]
pub struct ResponseSample {
    /// The request.
    pub request: RequestId,
    /// Who asked.
    pub tenant: TenantId,
    /// `completions` or `chat`.
    pub endpoint: &'static str,
    /// Prompt token count (what `usage.prompt_tokens` said).
    pub prompt_tokens: u32,
    /// Completion token count.
    pub completion_tokens: u32,
    /// The generated text.
    pub text: String,
    /// `stop`, `length` or `abort`.
    pub finish_reason: &'static str,
    /// Time to first token.
    pub ttft: Option<Duration>,
}

/// One served choice for the recompute audit: what the auditor scores again on a clean pass.
#[derive(Clone, Debug, PartialEq)]
pub struct RecomputeSample {
    /// The request.
    pub request: RequestId,
    /// Who asked.
    pub tenant: TenantId,
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// The completion's token ids (end markers excluded).
    pub output: Vec<u32>,
    /// Each output token's raw logprob, as the serving path computed it.
    pub served_logprobs: Vec<f32>,
    /// The request's temperature.
    pub temperature: f32,
    /// The prefill and decode workers (node ids).
    pub prefill_node: String,
    /// The decode worker.
    pub decode_node: String,
    /// Decode's page table at the end: (page, generation).
    pub pages: Vec<(u32, u64)>,
    /// Leading prompt tokens that came from a prefix cache.
    pub cached_tokens: u32,
    /// The prefill's and the decode's arithmetic (from their `Info`).
    pub arithmetic: [String; 2],
}

/// Receives finished responses. Must not block: implementations queue or spawn.
pub trait SampleSink: Send + Sync + 'static {
    /// Offered every finished response; the sink decides whether to keep it.
    fn offer(&self, sample: ResponseSample) {
        let _ = sample;
    }

    /// Told every completed cache erasure (`DELETE /v1/cache`), to be logged.
    fn erased(&self, certificate: &CacheErasure) {
        let _ = certificate;
    }

    /// Whether [`SampleSink::recompute`] goes anywhere: only then does the router pick
    /// requests for the recompute audit (and ask decode for their logprobs).
    fn takes_recomputes(&self) -> bool {
        false
    }

    /// Offered each served choice picked for the recompute audit.
    fn recompute(&self, sample: RecomputeSample) {
        let _ = sample;
    }
}

/// The default sink: keeps nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoSampling;

impl SampleSink for NoSampling {}
