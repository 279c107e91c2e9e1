//! The hook through which workers report integrity events (I8) to the auditor. Workers hold an
//! `Arc<dyn IntegritySink>`; the launcher wires the auditor's client in later. Until then,
//! [`LogIntegritySink`] writes each event as a structured warning.

use crate::cache_event::CacheEvent;

pub use pagewarden_types::integrity::{IntegrityEvent, IntegrityKind, PageTag};

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
