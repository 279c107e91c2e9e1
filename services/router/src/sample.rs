//! The auditor's hook: every finished response is offered to a [`SampleSink`], and every
//! prefix-cache erasure's certificate told to it; the default does nothing. The launcher wires
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
}

/// The default sink: keeps nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoSampling;

impl SampleSink for NoSampling {}
