//! The hook through which workers report integrity events (I8) to the auditor. Workers hold an
//! `Arc<dyn IntegritySink>`; the launcher wires the auditor's client in later. Until then,
//! [`LogIntegritySink`] writes each event as a structured warning.

use crate::cache_event::CacheEvent;
use crate::{RequestId, TenantId};

/// What kind of violation or release outcome was detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IntegrityKind {
    /// A KV read presented a stale page generation (I1).
    GenerationMismatch,
    /// A page's bytes did not match its checksum (I2).
    ChecksumMismatch,
    /// Tokens written != tokens reserved (I2).
    TokenCountMismatch,
    /// A granted page was never written (I2).
    PageNotWritten,
    /// A guard word was overwritten (I2).
    GuardWordCorrupt,
    /// The manifest digest or key did not match (I2).
    ManifestMismatch,
    /// A message of an old attempt or revoked grant was dropped (I5).
    StaleMessage,
    /// Pages of a revoked grant went to quarantine (I4).
    Quarantine,
}

impl IntegrityKind {
    /// Stable label for metrics and the auditor.
    pub fn as_str(self) -> &'static str {
        match self {
            IntegrityKind::GenerationMismatch => "generation_mismatch",
            IntegrityKind::ChecksumMismatch => "checksum_mismatch",
            IntegrityKind::TokenCountMismatch => "token_count_mismatch",
            IntegrityKind::PageNotWritten => "page_not_written",
            IntegrityKind::GuardWordCorrupt => "guard_word_corrupt",
            IntegrityKind::ManifestMismatch => "manifest_mismatch",
            IntegrityKind::StaleMessage => "stale_message",
            IntegrityKind::Quarantine => "quarantine",
        }
    }
}

/// The KV page an event concerns, as the auditor files it: incidents that share a page link
/// to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageTag {
    /// The page's index in the reporting worker's pool.
    pub page: u32,
    /// The page generation the event is about.
    pub generation: u64,
}

/// One detected event.
#[derive(Debug, Clone)]
pub struct IntegrityEvent {
    /// The reporting node.
    pub node_id: String,
    /// "prefill" or "decode".
    pub role: &'static str,
    /// What happened.
    pub kind: IntegrityKind,
    /// The affected request, if known.
    pub request: Option<RequestId>,
    /// Its tenant, if known.
    pub tenant: Option<TenantId>,
    /// The page it concerns, if one.
    pub page: Option<PageTag>,
    /// Human-readable detail (the typed error's message).
    pub detail: String,
}

/// Where integrity events go. Implementations must not block (called from request paths).
pub trait IntegritySink: Send + Sync {
    /// Reports one event.
    fn report(&self, event: IntegrityEvent);

    /// Reports a prefix-cache event (I10): what the auditor keeps per namespace. Not an
    /// integrity violation; the default keeps nothing (the worker's metrics count them).
    fn cache(&self, event: CacheEvent) {
        let _ = event;
    }
}

/// Discards events.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopIntegritySink;

impl IntegritySink for NoopIntegritySink {
    fn report(&self, _event: IntegrityEvent) {}
}

/// Logs each event as a structured `warn`.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogIntegritySink;

impl IntegritySink for LogIntegritySink {
    fn report(&self, e: IntegrityEvent) {
        tracing::warn!(
            node = %e.node_id,
            role = e.role,
            kind = e.kind.as_str(),
            request = ?e.request,
            tenant = ?e.tenant,
            page = e.page.map(|t| t.page),
            generation = e.page.map(|t| t.generation),
            detail = %e.detail,
            "integrity event"
        );
    }
}
