//! [`RejectReason`]: why a worker refused a request, the one list of them. The wire enum
//! (`pagewarden.v1.RejectReason`, carried in a refusing status's details) is pinned to it by a
//! round-trip test in `pagewarden-proto`, and its spellings are the metrics' `reason` labels.

use std::fmt;

/// Why a worker refused a request: at admission ([`crate::admission::Rejection`]) or because
/// its bounded wait for pages or compute ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// No prompt tokens.
    EmptyPrompt,
    /// `max_tokens` was zero.
    ZeroMaxTokens,
    /// Prompt plus `max_tokens` exceeds the effective context (I3).
    ContextLengthExceeded,
    /// The worker's waiting queue is at its bound.
    QueueFull,
    /// The request waited the worker's whole queue timeout.
    QueueTimeout,
}

impl RejectReason {
    /// Every reason, in the wire enum's order.
    pub const ALL: &'static [RejectReason] = &[
        RejectReason::EmptyPrompt,
        RejectReason::ZeroMaxTokens,
        RejectReason::ContextLengthExceeded,
        RejectReason::QueueFull,
        RejectReason::QueueTimeout,
    ];

    /// The spelling in metrics' labels and logs: the wire name, lower-cased, without its
    /// `REJECT_REASON_` prefix.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::EmptyPrompt => "empty_prompt",
            RejectReason::ZeroMaxTokens => "zero_max_tokens",
            RejectReason::ContextLengthExceeded => "context_length_exceeded",
            RejectReason::QueueFull => "queue_full",
            RejectReason::QueueTimeout => "queue_timeout",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
