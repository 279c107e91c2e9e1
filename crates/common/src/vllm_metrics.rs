//! Metrics under vLLM's names and labels (`vllm:*`, labelled `model_name`), beside Pagewarden's
//! own `pagewarden_*` ones, so that dashboards and alerts written for vLLM work unchanged
//! (`deploy/compose/grafana/` holds one).
//!
//! vLLM splits them between its API server and its engines, and so does Pagewarden:
//! - the router records what a request sees end to end ([`VllmMetrics::first_token`],
//!   [`VllmMetrics::next_token`], [`VllmMetrics::finished`]);
//! - each worker records its engine state ([`VllmMetrics::set_running`],
//!   [`VllmMetrics::set_waiting`], [`VllmMetrics::set_kv_usage`],
//!   [`VllmMetrics::observe_queue_time`]).
//!
//! Every series also carries `engine` (`router`, `prefill` or `decode`), so a sum over the suite
//! can tell prefill's queue from decode's.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The labels of every `vllm:*` series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// The served model's name, as `/v1/models` lists it.
    pub model_name: String,
    /// Which part of the suite records it.
    pub engine: &'static str,
}

/// The labels of `vllm:request_success_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FinishLabels {
    /// The served model's name.
    pub model_name: String,
    /// Which part of the suite records it.
    pub engine: &'static str,
    /// `stop`, `length` or `abort`, as in vLLM.
    pub finished_reason: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn seconds() -> Histogram {
    // 1 ms … about 9 min.
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

fn token_counts() -> Histogram {
    // 1 … 65,536 tokens.
    Histogram::new(exponential_buckets(1.0, 2.0, 17))
}

/// One request's figures when it finishes, for [`VllmMetrics::finished`].
#[derive(Clone, Copy, Debug)]
pub struct FinishedRequest {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub generation_tokens: u64,
    /// Seconds from arrival to the last token.
    pub e2e_seconds: f64,
    /// `stop`, `length` or `abort`.
    pub finished_reason: &'static str,
}

/// Every `vllm:*` metric, in a registry of its own (no prefix: the names carry `vllm:`).
pub struct VllmMetrics {
    registry: Registry,
    labels: ModelLabels,
    e2e: Histograms<ModelLabels>,
    ttft: Histograms<ModelLabels>,
    inter_token: Histograms<ModelLabels>,
    queue_time: Histograms<ModelLabels>,
    request_prompt_tokens: Histograms<ModelLabels>,
    request_generation_tokens: Histograms<ModelLabels>,
    prompt_tokens: Family<ModelLabels, Counter>,
    generation_tokens: Family<ModelLabels, Counter>,
    success: Family<FinishLabels, Counter>,
    running: Family<ModelLabels, Gauge>,
    waiting: Family<ModelLabels, Gauge>,
    kv_usage: Family<ModelLabels, Gauge<f64, AtomicU64>>,
    prefix_queries: Family<ModelLabels, Counter>,
    prefix_hits: Family<ModelLabels, Counter>,
}

impl VllmMetrics {
    /// Registers every metric; series appear once first recorded.
    pub fn new(model_name: &str, engine: &'static str) -> Self {
        let mut registry = Registry::default();
        let m = Self {
            labels: ModelLabels {
                model_name: model_name.to_string(),
                engine,
            },
            e2e: Family::new_with_constructor(seconds),
            ttft: Family::new_with_constructor(seconds),
            inter_token: Family::new_with_constructor(seconds),
            queue_time: Family::new_with_constructor(seconds),
            request_prompt_tokens: Family::new_with_constructor(token_counts),
            request_generation_tokens: Family::new_with_constructor(token_counts),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            success: Family::default(),
            running: Family::default(),
            waiting: Family::default(),
            kv_usage: Family::default(),
            prefix_queries: Family::default(),
            prefix_hits: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            m.e2e.clone(),
        );
        registry.register(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            m.ttft.clone(),
        );
        registry.register(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            m.inter_token.clone(),
        );
        registry.register(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent waiting in a queue for pages or compute, in seconds.",
            m.queue_time.clone(),
        );
        registry.register(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed, per request.",
            m.request_prompt_tokens.clone(),
        );
        registry.register(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed, per request.",
            m.request_generation_tokens.clone(),
        );
        // Counters are rendered with the `_total` suffix.
        registry.register(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            m.prompt_tokens.clone(),
        );
        registry.register(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            m.generation_tokens.clone(),
        );
        registry.register(
            "vllm:request_success",
            "Count of successfully processed requests, by finish reason.",
            m.success.clone(),
        );
        registry.register(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            m.running.clone(),
        );
        registry.register(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            m.waiting.clone(),
        );
        registry.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            m.kv_usage.clone(),
        );
        registry.register(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            m.prefix_queries.clone(),
        );
        registry.register(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            m.prefix_hits.clone(),
        );
        Self { registry, ..m }
    }

    /// A prefix-cache lookup of `queried` prompt tokens that found `hits` of them cached.
    pub fn prefix_lookup(&self, queried: usize, hits: usize) {
        self.prefix_queries
            .get_or_create(&self.labels)
            .inc_by(queried as u64);
        self.prefix_hits
            .get_or_create(&self.labels)
            .inc_by(hits as u64);
    }

    /// The registry, for [`crate::metrics::encode`].
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// A request's first token arrived `secs` after the request did.
    pub fn first_token(&self, secs: f64) {
        self.ttft.get_or_create(&self.labels).observe(secs);
    }

    /// A later token arrived `secs` after the one before.
    pub fn next_token(&self, secs: f64) {
        self.inter_token.get_or_create(&self.labels).observe(secs);
    }

    /// A request finished (stop, length or abort by a worker).
    pub fn finished(&self, r: FinishedRequest) {
        self.e2e.get_or_create(&self.labels).observe(r.e2e_seconds);
        self.request_prompt_tokens
            .get_or_create(&self.labels)
            .observe(r.prompt_tokens as f64);
        self.request_generation_tokens
            .get_or_create(&self.labels)
            .observe(r.generation_tokens as f64);
        self.prompt_tokens
            .get_or_create(&self.labels)
            .inc_by(r.prompt_tokens);
        self.generation_tokens
            .get_or_create(&self.labels)
            .inc_by(r.generation_tokens);
        self.success
            .get_or_create(&FinishLabels {
                model_name: self.labels.model_name.clone(),
                engine: self.labels.engine,
                finished_reason: r.finished_reason,
            })
            .inc();
    }

    /// Requests being computed now.
    pub fn set_running(&self, n: usize) {
        self.running.get_or_create(&self.labels).set(n as i64);
    }

    /// Requests waiting in the queue.
    pub fn set_waiting(&self, n: usize) {
        self.waiting.get_or_create(&self.labels).set(n as i64);
    }

    /// The share of the KV pool's pages not free, 0.0 ..= 1.0.
    pub fn set_kv_usage(&self, used_share: f64) {
        self.kv_usage.get_or_create(&self.labels).set(used_share);
    }

    /// A request left the queue for pages or compute after `secs`.
    pub fn observe_queue_time(&self, secs: f64) {
        self.queue_time.get_or_create(&self.labels).observe(secs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{encode, sample_value};

    #[test]
    fn names_and_labels_are_vllms() {
        let m = VllmMetrics::new("smol", "router");
        m.finished(FinishedRequest {
            prompt_tokens: 12,
            generation_tokens: 3,
            e2e_seconds: 0.5,
            finished_reason: "length",
        });
        m.set_kv_usage(0.25);
        let text = encode(&[m.registry()]);
        assert_eq!(
            sample_value(
                &text,
                "vllm:prompt_tokens_total{model_name=\"smol\",engine=\"router\"}"
            ),
            Some(12.0)
        );
        assert_eq!(
            sample_value(
                &text,
                "vllm:request_success_total{model_name=\"smol\",engine=\"router\",finished_reason=\"length\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample_value(
                &text,
                "vllm:kv_cache_usage_perc{model_name=\"smol\",engine=\"router\"}"
            ),
            Some(0.25)
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
