//! What a worker says about its prefix cache (I10): per-tenant metrics, and each hit, miss and
//! eviction to the auditor, which keeps them per namespace, with the pages each namespace holds
//! after every change (a publish, an eviction, an erasure). Prefill and decode both report
//! through it, and erase a tenant's namespace through it (`DELETE /v1/cache`).

use std::collections::HashMap;
use std::sync::Arc;

use pagewarden_common::cache_event::CacheEvent;
use pagewarden_common::integrity::IntegritySink;
use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_common::namespace::Namespace;
use pagewarden_common::{RequestId, TenantId};
use pagewarden_kvcache::{Erasure, KvPool, Published};
use parking_lot::Mutex;

/// Namespaces whose last user is remembered; beyond it the memory starts over (an eviction
/// then names no tenant).
const REMEMBERED: usize = 4096;

/// A worker's account of its prefix cache.
pub struct PrefixCacheLog {
    node_id: String,
    role: &'static str,
    pool: KvPool,
    metrics: Arc<WorkerMetrics>,
    sink: Arc<dyn IntegritySink>,
    /// Whose request last used each namespace here: an eviction names that tenant.
    last_user: Mutex<HashMap<Namespace, TenantId>>,
}

impl PrefixCacheLog {
    /// A log for worker `node_id` (`role` prefill or decode) over `pool`'s prefix cache,
    /// counting into `metrics` and reporting each event to `sink`.
    pub fn new(
        node_id: &str,
        role: &'static str,
        pool: KvPool,
        metrics: Arc<WorkerMetrics>,
        sink: Arc<dyn IntegritySink>,
    ) -> Self {
        PrefixCacheLog {
            node_id: node_id.to_string(),
            role,
            pool,
            metrics,
            sink,
            last_user: Mutex::new(HashMap::new()),
        }
    }

    /// `request`'s prompt of `prompt_tokens` found `hit_tokens` cached under `namespace`.
    pub fn lookup(
        &self,
        tenant: &TenantId,
        namespace: &Namespace,
        request: RequestId,
        prompt_tokens: usize,
        hit_tokens: usize,
    ) {
        self.metrics
            .prefix_lookup(tenant, prompt_tokens, hit_tokens);
        self.used_by(namespace, tenant);
        self.sink.cache(CacheEvent::lookup(
            &self.node_id,
            self.role,
            tenant,
            *namespace,
            request,
            prompt_tokens,
            hit_tokens,
        ));
        self.report_reclaimed();
    }

    /// A request of `tenant` published its pages under `namespace`.
    pub fn published(&self, tenant: &TenantId, namespace: &Namespace, published: &Published) {
        self.used_by(namespace, tenant);
        let held = self.pool.cached_pages(namespace);
        self.metrics.prefix_cached(tenant, held);
        self.evicted(Some(tenant.clone()), namespace, published.evicted);
        self.held(Some(tenant.clone()), namespace, held);
        self.report_reclaimed();
    }

    /// Erases `namespace` (the calling `tenant`'s) from the pool's prefix cache
    /// ([`KvPool::erase_namespace`]): its pages gauge goes to 0 and the erased pages are
    /// reported as an eviction of the namespace.
    pub fn erase(&self, tenant: &TenantId, namespace: &Namespace) -> Erasure {
        let erasure = self.pool.erase_namespace(namespace);
        self.metrics.prefix_cached(tenant, 0);
        self.evicted(Some(tenant.clone()), namespace, erasure.entries);
        self.held(Some(tenant.clone()), namespace, 0);
        tracing::info!(
            tenant = %tenant,
            namespace = %namespace,
            entries = erasure.entries,
            pages_zeroed = erasure.pages_zeroed,
            pages_deferred = erasure.pages_deferred,
            "prefix cache erased"
        );
        erasure
    }

    fn used_by(&self, namespace: &Namespace, tenant: &TenantId) {
        let mut last = self.last_user.lock();
        if last.len() >= REMEMBERED && !last.contains_key(namespace) {
            last.clear();
        }
        last.insert(*namespace, tenant.clone());
    }

    /// Pages of other namespaces that allocations took since the last report.
    fn report_reclaimed(&self) {
        for (ns, pages) in self.pool.take_reclaimed() {
            let tenant = self.last_user.lock().get(&ns).cloned();
            self.evicted(tenant.clone(), &ns, pages);
            self.held(tenant, &ns, self.pool.cached_pages(&ns));
        }
    }

    /// Tells the auditor that `namespace` holds `pages` cached pages here now.
    fn held(&self, tenant: Option<TenantId>, namespace: &Namespace, pages: usize) {
        self.sink.cache(CacheEvent::held(
            &self.node_id,
            self.role,
            tenant,
            *namespace,
            pages,
        ));
    }

    fn evicted(&self, tenant: Option<TenantId>, namespace: &Namespace, pages: usize) {
        if pages == 0 {
            return;
        }
        self.metrics.prefix_evicted(pages);
        self.sink.cache(CacheEvent::eviction(
            &self.node_id,
            self.role,
            tenant,
            *namespace,
            pages,
        ));
    }
}
