//! Prometheus metrics shared by the workers (`pagewarden_` prefix, plus vLLM's engine metrics from
//! [`crate::vllm_metrics`]), the `/metrics` HTTP server, and [`encode`], the one text encoder of
//! every service.
//!
//! One [`WorkerMetrics`] per process, shared with `Arc`. Pool figures that live in the KV pool's
//! own counters are mirrored into the registry at scrape time by a refresh hook
//! ([`serve_metrics`]'s `refresh`), so the text is always current.

use std::future::Future;
use std::sync::Arc;

use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::auditor_client::ClientStats;
use crate::edge::{serve_edge, EdgeCounters, EdgeLimits};
use crate::reject_reason::RejectReason;
use crate::secret::SecretHash;
use crate::vllm_metrics::{CacheConfig, VllmMetrics};
use crate::TenantId;

/// The OpenMetrics text of `registries`, one after another, ended by one `# EOF`.
pub fn encode(registries: &[&Registry]) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    for r in registries {
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, r);
    }
    let _ = prometheus_client::encoding::text::encode_eof(&mut out);
    out
}

/// A label set with one `outcome` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// e.g. `ok`, `rejected`, `aborted`, `error`.
    pub outcome: &'static str,
}

/// A label set with one `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// e.g. `context_length_exceeded`.
    pub reason: &'static str,
}

/// A label set with one `state` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `free`, `used`, `draining`, `quarantined`.
    pub state: &'static str,
}

/// A label set with one `kind` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    /// The tenant's name (never its namespace or key).
    pub tenant: String,
}

/// The `kind` label of an integrity metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// e.g. `generation_mismatch`, `checksum_mismatch`.
    pub kind: &'static str,
}

/// Page counts of one KV pool, as the pool reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolGauges {
    /// Free pages.
    pub free: u64,
    /// Pages held by requests (reserved or readable).
    pub used: u64,
    /// Pages of revoked grants waiting for their drain.
    pub draining: u64,
    /// Pages whose drain could not be confirmed.
    pub quarantined: u64,
}

/// Every metric a worker exports.
pub struct WorkerMetrics {
    registry: Registry,
    requests: Family<OutcomeLabel, Counter>,
    rejections: Family<ReasonLabel, Counter>,
    pool_pages: Family<StateLabel, Gauge>,
    deferred_releases: Family<OutcomeLabel, Counter>,
    integrity_failures: Family<KindLabel, Counter>,
    stale_messages: Counter,
    active_requests: Gauge,
    queue_depth: Gauge,
    ttft: Histogram,
    inter_token: Histogram,
    transfer_bytes: Counter,
    transfer_duration: Histogram,
    prefill_duration: Histogram,
    prefill_chunks: Counter,
    generated_tokens: Counter,
    preemptions: Counter,
    share_preemptions: Counter,
    prefix_queried: Family<TenantLabel, Counter>,
    prefix_hits: Family<TenantLabel, Counter>,
    prefix_pages: Family<TenantLabel, Gauge>,
    prefix_evictions: Counter,
    edge: EdgeCounters,
    auditor_reports: Family<OutcomeLabel, Counter>,
    vllm: VllmMetrics,
}

impl WorkerMetrics {
    /// Registers every metric under the `pagewarden_` prefix, with a constant `role` label, and
    /// vLLM's engine metrics for `model_name`.
    pub fn new(role: &'static str, model_name: &str) -> Self {
        let mut registry = Registry::with_prefix_and_labels(
            "pagewarden",
            [(
                std::borrow::Cow::Borrowed("role"),
                std::borrow::Cow::Borrowed(role),
            )]
            .into_iter(),
        );
        let m = Self {
            requests: Family::default(),
            rejections: Family::default(),
            pool_pages: Family::default(),
            deferred_releases: Family::default(),
            integrity_failures: Family::default(),
            stale_messages: Counter::default(),
            active_requests: Gauge::default(),
            queue_depth: Gauge::default(),
            ttft: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            inter_token: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            transfer_bytes: Counter::default(),
            transfer_duration: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            prefill_duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            prefill_chunks: Counter::default(),
            generated_tokens: Counter::default(),
            preemptions: Counter::default(),
            share_preemptions: Counter::default(),
            prefix_queried: Family::default(),
            prefix_hits: Family::default(),
            prefix_pages: Family::default(),
            prefix_evictions: Counter::default(),
            edge: EdgeCounters::default(),
            auditor_reports: Family::default(),
            vllm: VllmMetrics::new(model_name, role),
            registry: Registry::default(),
        };
        registry.register("requests", "Requests by outcome", m.requests.clone());
        registry.register(
            "rejections",
            "Admission rejections by reason",
            m.rejections.clone(),
        );
        registry.register("pool_pages", "KV pool pages by state", m.pool_pages.clone());
        registry.register(
            "deferred_releases",
            "Deferred page releases of revoked grants by outcome (drained, quarantined, released)",
            m.deferred_releases.clone(),
        );
        registry.register(
            "integrity_failures",
            "Integrity violations detected, by kind",
            m.integrity_failures.clone(),
        );
        registry.register(
            "stale_messages",
            "Stale messages (old attempt, revoked grant) dropped",
            m.stale_messages.clone(),
        );
        registry.register(
            "active_requests",
            "Requests in flight",
            m.active_requests.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for pages or compute (holding no pages)",
            m.queue_depth.clone(),
        );
        registry.register(
            "ttft_seconds",
            "Time to first token (decode: commit to first event)",
            m.ttft.clone(),
        );
        registry.register(
            "inter_token_latency_seconds",
            "Time between streamed tokens",
            m.inter_token.clone(),
        );
        registry.register(
            "transfer_bytes",
            "KV bytes transferred",
            m.transfer_bytes.clone(),
        );
        registry.register(
            "transfer_duration_seconds",
            "Duration of one request's KV transfer",
            m.transfer_duration.clone(),
        );
        registry.register(
            "prefill_duration_seconds",
            "Duration of one prompt's forward pass",
            m.prefill_duration.clone(),
        );
        registry.register(
            "prefill_chunks",
            "Prefill chunks computed (a cancel stops a prompt within one)",
            m.prefill_chunks.clone(),
        );
        registry.register(
            "prefix_cache_queried_tokens",
            "Prompt tokens looked up in the prefix cache, by tenant",
            m.prefix_queried.clone(),
        );
        registry.register(
            "prefix_cache_hit_tokens",
            "Prompt tokens whose KV came from the prefix cache, by tenant",
            m.prefix_hits.clone(),
        );
        registry.register(
            "prefix_cache_pages",
            "Pages cached in the tenant's prefix-cache namespace, after its last request",
            m.prefix_pages.clone(),
        );
        registry.register(
            "prefix_cache_evictions",
            "Cached prefix pages evicted to keep a namespace within its quota",
            m.prefix_evictions.clone(),
        );
        registry.register(
            "generated_tokens",
            "Tokens generated",
            m.generated_tokens.clone(),
        );
        registry.register(
            "preemptions",
            "Sequences preempted for KV pages (their pages freed, recomputed later)",
            m.preemptions.clone(),
        );
        registry.register(
            "share_preemptions",
            "Of those, sequences of a tenant over its share of the pool preempted so that \
             another tenant's waiting request could be granted",
            m.share_preemptions.clone(),
        );
        registry.register(
            "auditor_reports",
            "Reports to the auditor by what became of them: sent, dropped (buffer full), failed \
             (refused by the auditor), retried (attempts repeated after the auditor failed)",
            m.auditor_reports.clone(),
        );
        m.edge
            .register(registry.sub_registry_with_prefix("metrics_listener"));
        m.vllm.show_engine_series();
        Self { registry, ..m }
    }

    /// Counts a finished request.
    pub fn request(&self, outcome: &'static str) {
        self.requests.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Counts a refused request, labelled with its reason's spelling.
    pub fn rejection(&self, reason: RejectReason) {
        self.rejections
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Counts an integrity violation.
    pub fn integrity_failure(&self, kind: &'static str) {
        self.integrity_failures
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    /// Counts a dropped stale message.
    pub fn stale_message(&self) {
        self.stale_messages.inc();
    }

    /// Sets the in-flight gauge.
    pub fn set_active(&self, n: usize) {
        self.active_requests.set(n as i64);
        self.vllm.set_running(n);
    }

    /// Sets the waiting-queue gauge.
    pub fn set_queue_depth(&self, n: usize) {
        self.queue_depth.set(n as i64);
        self.vllm.set_waiting(n);
    }

    /// Records how long a request waited in the queue before it got pages or compute.
    pub fn observe_queue_time(&self, secs: f64) {
        self.vllm.observe_queue_time(secs);
    }

    /// Records a time to first token.
    pub fn observe_ttft(&self, secs: f64) {
        self.ttft.observe(secs);
    }

    /// Records an inter-token gap.
    pub fn observe_inter_token(&self, secs: f64) {
        self.inter_token.observe(secs);
    }

    /// Counts one computed prefill chunk.
    pub fn prefill_chunk(&self) {
        self.prefill_chunks.inc();
    }

    /// One engine step (a batched decode step, a prefill or recompute chunk) computed `tokens`.
    pub fn iteration(&self, tokens: usize) {
        self.vllm.iteration(tokens);
    }

    /// The KV cache this worker runs with, for `vllm:cache_config_info`.
    pub fn set_cache_config(&self, c: CacheConfig) {
        self.vllm.set_cache_config(c);
    }

    /// Counts generated tokens.
    pub fn generated(&self, n: u64) {
        self.generated_tokens.inc_by(n);
    }

    /// Counts a sequence preempted for pages.
    pub fn preempted(&self) {
        self.preemptions.inc();
        self.vllm.preempted();
    }

    /// Counts a sequence preempted for another tenant's share of the pool (also counted by
    /// [`WorkerMetrics::preempted`]).
    pub fn preempted_for_share(&self) {
        self.share_preemptions.inc();
    }

    /// Records one transfer.
    pub fn observe_transfer(&self, bytes: u64, secs: f64) {
        self.transfer_bytes.inc_by(bytes);
        self.transfer_duration.observe(secs);
    }

    /// Mirrors a monotonic count of transferred bytes kept elsewhere (decode's receiver).
    pub fn mirror_transfer_bytes(&self, total: u64) {
        let seen = self.transfer_bytes.get();
        if total > seen {
            self.transfer_bytes.inc_by(total - seen);
        }
    }

    /// A prefix-cache lookup of a prompt of `prompt_tokens` that found `hit_tokens` cached.
    pub fn prefix_lookup(&self, tenant: &TenantId, prompt_tokens: usize, hit_tokens: usize) {
        let label = TenantLabel {
            tenant: tenant.as_str().to_string(),
        };
        self.prefix_queried
            .get_or_create(&label)
            .inc_by(prompt_tokens as u64);
        self.prefix_hits
            .get_or_create(&label)
            .inc_by(hit_tokens as u64);
        self.vllm.prefix_lookup(prompt_tokens, hit_tokens);
    }

    /// `tenant`'s namespace now holds `cached_pages` cached pages.
    pub fn prefix_cached(&self, tenant: &TenantId, cached_pages: usize) {
        self.prefix_pages
            .get_or_create(&TenantLabel {
                tenant: tenant.as_str().to_string(),
            })
            .set(cached_pages as i64);
    }

    /// `pages` cached pages were given up (a namespace's quota, or an allocation).
    pub fn prefix_evicted(&self, pages: usize) {
        self.prefix_evictions.inc_by(pages as u64);
    }

    /// Records one prompt's forward pass.
    pub fn observe_prefill(&self, secs: f64) {
        self.prefill_duration.observe(secs);
    }

    /// Mirrors the pool's page counts.
    pub fn set_pool(&self, g: PoolGauges) {
        for (state, v) in [
            ("free", g.free),
            ("used", g.used),
            ("draining", g.draining),
            ("quarantined", g.quarantined),
        ] {
            self.pool_pages
                .get_or_create(&StateLabel { state })
                .set(v as i64);
        }
        let total = g.free + g.used + g.draining + g.quarantined;
        if total > 0 {
            self.vllm
                .set_kv_usage((total - g.free) as f64 / total as f64);
        }
    }

    /// Mirrors a monotonic total kept elsewhere (the pool's deferred-release counters) into
    /// the `deferred_releases` counter of `outcome`.
    pub fn mirror_deferred_release(&self, outcome: &'static str, total: u64) {
        let c = self
            .deferred_releases
            .get_or_create(&OutcomeLabel { outcome });
        let seen = c.get();
        if total > seen {
            c.inc_by(total - seen);
        }
    }

    /// Mirrors the auditor client's counts (kept by the client) into `auditor_reports`.
    pub fn mirror_auditor_client(&self, s: ClientStats) {
        for (outcome, total) in [
            ("sent", s.sent),
            ("dropped", s.dropped),
            ("failed", s.failed),
            ("retried", s.retried),
        ] {
            let c = self
                .auditor_reports
                .get_or_create(&OutcomeLabel { outcome });
            let seen = c.get();
            if total > seen {
                c.inc_by(total - seen);
            }
        }
    }

    /// Mirrors a monotonic integrity total kept elsewhere (the pool's counters).
    pub fn mirror_integrity(&self, kind: &'static str, total: u64) {
        let c = self.integrity_failures.get_or_create(&KindLabel { kind });
        let seen = c.get();
        if total > seen {
            c.inc_by(total - seen);
        }
    }

    /// Prometheus text of every metric.
    pub fn render(&self) -> String {
        encode(&[&self.registry, self.vllm.registry()])
    }
}

/// Called before each scrape to copy external figures (pool stats) into the metrics.
pub type RefreshHook = Arc<dyn Fn(&WorkerMetrics) + Send + Sync>;

/// Serves `GET /metrics`, `/live` and `/ready` on `listener` until `shutdown` resolves, behind
/// the same edge as every client-facing listener (a scraper's idle sockets cannot pile up).
/// With `token`, `/metrics` answers 401 to a scrape without `Authorization: Bearer` and the
/// token whose hash it is; `/live` and `/ready` (which tell nothing but that the worker is up)
/// stay open to probes.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<WorkerMetrics>,
    refresh: RefreshHook,
    token: Option<SecretHash>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // `/live` and `/ready`: the listener binds only once the model is loaded and the preflight
    // passed, and closes at shutdown, so answering at all means both.
    let app = axum::Router::new()
        .route("/live", get(|| async { "ok" }))
        .route("/ready", get(|| async { "ok" }))
        .route(
            "/metrics",
            get({
                let metrics = metrics.clone();
                move |headers: axum::http::HeaderMap| {
                    let metrics = metrics.clone();
                    let refresh = refresh.clone();
                    async move {
                        if !scrape_allowed(token, &headers) {
                            return (
                                axum::http::StatusCode::UNAUTHORIZED,
                                [(
                                    axum::http::header::WWW_AUTHENTICATE,
                                    "Bearer realm=\"metrics\"",
                                )],
                                "this /metrics needs the worker's metrics token as a bearer token",
                            )
                                .into_response();
                        }
                        refresh(&metrics);
                        (
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            metrics.render(),
                        )
                            .into_response()
                    }
                }
            }),
        );
    let counters = metrics.edge.clone();
    serve_edge(listener, app, EdgeLimits::default(), counters, shutdown).await
}

/// Whether a scrape with `headers` may read `/metrics`: always without a token, else only with
/// `Authorization: Bearer` and the token hashing to `token`.
fn scrape_allowed(token: Option<SecretHash>, headers: &axum::http::HeaderMap) -> bool {
    let Some(want) = token else {
        return true;
    };
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| SecretHash::of(given) == want)
}

/// Reads one sample's value out of Prometheus text (`name{labels} value`); labels must match
/// exactly as rendered (e.g. `pagewarden_pool_pages{role="decode",state="free"}`). For tests.
pub fn sample_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_auditor_clients_counts_are_exported() {
        let m = WorkerMetrics::new("decode", "smol");
        let stats = |dropped, retried| ClientStats {
            queued: 10,
            dropped,
            sent: 4,
            failed: 1,
            retried,
        };
        m.mirror_auditor_client(stats(2, 3));
        m.mirror_auditor_client(stats(5, 3));
        let text = m.render();
        let got = |outcome: &str| {
            sample_value(
                &text,
                &format!(
                    "pagewarden_auditor_reports_total{{role=\"decode\",outcome=\"{outcome}\"}}"
                ),
            )
        };
        assert_eq!(got("dropped"), Some(5.0), "{text}");
        assert_eq!(got("retried"), Some(3.0));
        assert_eq!(got("sent"), Some(4.0));
        assert_eq!(got("failed"), Some(1.0));
    }

    #[test]
    fn names_are_prefixed_and_values_render() {
        let m = WorkerMetrics::new("decode", "smol");
        m.rejection(RejectReason::ContextLengthExceeded);
        m.set_pool(PoolGauges {
            free: 7,
            used: 1,
            draining: 0,
            quarantined: 2,
        });
        m.mirror_deferred_release("drained", 3);
        m.mirror_deferred_release("drained", 5);
        m.observe_ttft(0.1);
        let text = m.render();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            assert!(
                line.starts_with("pagewarden_") || line.starts_with("vllm:"),
                "{line}"
            );
        }
        assert_eq!(
            sample_value(
                &text,
                "pagewarden_rejections_total{role=\"decode\",reason=\"context_length_exceeded\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample_value(
                &text,
                "pagewarden_pool_pages{role=\"decode\",state=\"free\"}"
            ),
            Some(7.0)
        );
        assert_eq!(
            sample_value(
                &text,
                "pagewarden_deferred_releases_total{role=\"decode\",outcome=\"drained\"}"
            ),
            Some(5.0)
        );
    }

    #[test]
    fn a_metrics_token_admits_only_its_bearer() {
        use axum::http::{header::AUTHORIZATION, HeaderMap, HeaderValue};
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(AUTHORIZATION, HeaderValue::from_static(v));
            h
        };
        let token = Some(SecretHash::of("0123456789abcdef"));
        assert!(scrape_allowed(None, &HeaderMap::new()), "no token: open");
        assert!(!scrape_allowed(token, &HeaderMap::new()));
        assert!(!scrape_allowed(token, &with("Bearer wrong-token-wrong!")));
        assert!(!scrape_allowed(token, &with("Basic 0123456789abcdef")));
        assert!(scrape_allowed(token, &with("Bearer 0123456789abcdef")));
    }
}
