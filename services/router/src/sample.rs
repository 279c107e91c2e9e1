//! The auditor's sampling hook: every finished response is offered to a [`SampleSink`]; the
//! default does nothing. The launcher wires the auditor's client in.

use std::time::Duration;

use pagewarden_common::{RequestId, TenantId};

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
}

/// The default sink: keeps nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoSampling;

impl SampleSink for NoSampling {}
