//! Prefix-cache events (I10), as a worker reports them to the auditor: a prompt's lookup in
//! its namespace (a hit, with how much was reused, or a miss), cached pages given up, and how
//! many cached pages a namespace holds after a publish, an eviction or an erasure. The
//! namespace travels as its tag only, never its key; the tenant names whose request it was.
//! `pagewarden-proto` turns an event into the auditor's `CacheReport`.

use crate::namespace::Namespace;
use crate::{RequestId, TenantId};

/// What happened in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheEventKind {
    /// A prompt found `cached_tokens` of itself cached.
    Hit,
    /// A prompt found nothing cached.
    Miss,
    /// `pages` cached pages of the namespace were given up (its quota, or an allocation that
    /// needed them).
    Eviction,
    /// The namespace now holds `pages` cached pages on this worker.
    Held,
}

/// One prefix-cache event on one worker.
#[derive(Clone, Debug)]
pub struct CacheEvent {
    /// Hit, miss, eviction or held.
    pub kind: CacheEventKind,
    /// The worker's node id.
    pub node_id: String,
    /// `prefill` or `decode`.
    pub role: &'static str,
    /// Hit, miss: whose prompt it was. Eviction, held: whose request last used the namespace
    /// here.
    pub tenant: Option<TenantId>,
    /// The prefix namespace looked up or evicted.
    pub namespace: Namespace,
    /// Hit, miss: the request.
    pub request: Option<RequestId>,
    /// Prompt tokens looked up.
    pub prompt_tokens: usize,
    /// Of those, found cached.
    pub cached_tokens: usize,
    /// Eviction: pages given up. Held: pages held now.
    pub pages: usize,
}

impl CacheEvent {
    /// The lookup of `request`'s `prompt_tokens`-token prompt, `cached_tokens` of them found.
    pub fn lookup(
        node_id: &str,
        role: &'static str,
        tenant: &TenantId,
        namespace: Namespace,
        request: RequestId,
        prompt_tokens: usize,
        cached_tokens: usize,
    ) -> Self {
        CacheEvent {
            kind: if cached_tokens > 0 {
                CacheEventKind::Hit
            } else {
                CacheEventKind::Miss
            },
            node_id: node_id.to_string(),
            role,
            tenant: Some(tenant.clone()),
            namespace,
            request: Some(request),
            prompt_tokens,
            cached_tokens,
            pages: 0,
        }
    }

    /// `pages` of `namespace`'s cached pages given up; `tenant` last used it here.
    pub fn eviction(
        node_id: &str,
        role: &'static str,
        tenant: Option<TenantId>,
        namespace: Namespace,
        pages: usize,
    ) -> Self {
        CacheEvent {
            kind: CacheEventKind::Eviction,
            node_id: node_id.to_string(),
            role,
            tenant,
            namespace,
            request: None,
            prompt_tokens: 0,
            cached_tokens: 0,
            pages,
        }
    }

    /// `namespace` holds `pages` cached pages on this worker now; `tenant` last used it here.
    pub fn held(
        node_id: &str,
        role: &'static str,
        tenant: Option<TenantId>,
        namespace: Namespace,
        pages: usize,
    ) -> Self {
        CacheEvent {
            kind: CacheEventKind::Held,
            ..Self::eviction(node_id, role, tenant, namespace, pages)
        }
    }
}
