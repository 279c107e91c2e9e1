//! Metrics under vLLM's names and labels (`vllm:*`, labelled `model_name`), beside Pagewarden's
//! own `pagewarden_*` ones, so that dashboards and alerts written for vLLM work unchanged
//! (`deploy/compose/grafana/` holds one).
//!
//! vLLM splits them between its API server and its engines, and so does Pagewarden:
//! - the router records what a request sees end to end ([`VllmMetrics::first_token`],
//!   [`VllmMetrics::next_token`], [`VllmMetrics::finished`],
//!   [`VllmMetrics::request_finished`]);
//! - each worker records its engine state ([`VllmMetrics::set_running`],
//!   [`VllmMetrics::set_waiting`], [`VllmMetrics::set_kv_usage`],
//!   [`VllmMetrics::observe_queue_time`], [`VllmMetrics::iteration`],
//!   [`VllmMetrics::preempted`], [`VllmMetrics::set_cache_config`]).
//!
//! Types, label names and bucket boundaries are vLLM's (`vllm/v1/metrics/loggers.py`), with one
//! difference: vLLM ends its token-count buckets at the model's context length, these run on to
//! [`TOKEN_BUCKETS_MAX`] whatever the model.
//!
//! Every series also carries `engine` (`router`, `prefill` or `decode`), so a sum over the suite
//! can tell prefill's queue from decode's.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
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

/// The labels of `vllm:cache_config_info`: vLLM's cache-config fields that Pagewarden has.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheConfigLabels {
    /// The served model's name.
    pub model_name: String,
    /// Which part of the suite records it.
    pub engine: &'static str,
    /// Tokens per KV page.
    pub block_size: String,
    /// Pages in the KV pool.
    pub num_gpu_blocks: String,
    /// The KV cache's element type.
    pub cache_dtype: &'static str,
    /// `True` or `False`, spelled as vLLM's Python prints it.
    pub enable_prefix_caching: &'static str,
}

/// A worker's KV cache as `vllm:cache_config_info` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Tokens per page.
    pub block_size: usize,
    /// Pages in the pool.
    pub num_blocks: usize,
    /// Whether finished prompts' pages stay in a prefix cache.
    pub prefix_caching: bool,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// vLLM's buckets of time to first token.
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's buckets of the time between two tokens (time per output token, inter-token latency).
const TOKEN_GAP_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// vLLM's buckets of a request's latencies: end to end, queue, prefill, decode, inference.
const REQUEST_LATENCY_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's buckets of tokens per engine step.
const ITERATION_TOKEN_BUCKETS: [f64; 13] = [
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// Where the 1-2-5 series of token-count buckets ends (vLLM ends it at the model's context).
pub const TOKEN_BUCKETS_MAX: u64 = 1_000_000;

fn ttft() -> Histogram {
    Histogram::new(TTFT_BUCKETS)
}

fn token_gaps() -> Histogram {
    Histogram::new(TOKEN_GAP_BUCKETS)
}

fn request_latency() -> Histogram {
    Histogram::new(REQUEST_LATENCY_BUCKETS)
}

fn iteration_tokens() -> Histogram {
    Histogram::new(ITERATION_TOKEN_BUCKETS)
}

/// 1, 2, 5, 10, 20, 50, … up to `max` (vLLM's `build_1_2_5_buckets`).
fn one_two_five(max: u64) -> Vec<f64> {
    (0..)
        .map(|e| 10u64.saturating_pow(e))
        .take_while(|&p| p <= max)
        .flat_map(|p| [p, 2 * p, 5 * p])
        .filter(|&b| b <= max)
        .map(|b| b as f64)
        .collect()
}

fn token_counts() -> Histogram {
    Histogram::new(one_two_five(TOKEN_BUCKETS_MAX))
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
    /// Where the time after the queue went, when the request ran to a first token.
    pub running: Option<RunningTimes>,
    /// `stop`, `length` or `abort`.
    pub finished_reason: &'static str,
}

/// A request's time after it left the queue (vLLM's RUNNING phase), in its two parts; vLLM's
/// inference time is their sum.
#[derive(Clone, Copy, Debug)]
pub struct RunningTimes {
    /// From leaving the queue to the first token (vLLM's PREFILL phase).
    pub prefill_seconds: f64,
    /// From the first token to the last (vLLM's DECODE phase).
    pub decode_seconds: f64,
}

/// Every `vllm:*` metric, in a registry of its own (no prefix: the names carry `vllm:`).
pub struct VllmMetrics {
    registry: Registry,
    labels: ModelLabels,
    e2e: Histograms<ModelLabels>,
    ttft: Histograms<ModelLabels>,
    inter_token: Histograms<ModelLabels>,
    time_per_output_token: Histograms<ModelLabels>,
    queue_time: Histograms<ModelLabels>,
    prefill_time: Histograms<ModelLabels>,
    decode_time: Histograms<ModelLabels>,
    inference_time: Histograms<ModelLabels>,
    request_prompt_tokens: Histograms<ModelLabels>,
    request_generation_tokens: Histograms<ModelLabels>,
    request_max_generation_tokens: Histograms<ModelLabels>,
    iteration_tokens: Histograms<ModelLabels>,
    preemptions: Family<ModelLabels, Counter>,
    cache_config: Family<CacheConfigLabels, Gauge>,
    prompt_tokens: Family<ModelLabels, Counter>,
    generation_tokens: Family<ModelLabels, Counter>,
    success: Family<FinishLabels, Counter>,
    running: Family<ModelLabels, Gauge>,
    waiting: Family<ModelLabels, Gauge>,
    kv_usage: Family<ModelLabels, Gauge<f64, AtomicU64>>,
    gpu_cache_usage: Family<ModelLabels, Gauge<f64, AtomicU64>>,
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
            e2e: Family::new_with_constructor(request_latency),
            ttft: Family::new_with_constructor(ttft),
            inter_token: Family::new_with_constructor(token_gaps),
            time_per_output_token: Family::new_with_constructor(token_gaps),
            queue_time: Family::new_with_constructor(request_latency),
            prefill_time: Family::new_with_constructor(request_latency),
            decode_time: Family::new_with_constructor(request_latency),
            inference_time: Family::new_with_constructor(request_latency),
            request_prompt_tokens: Family::new_with_constructor(token_counts),
            request_generation_tokens: Family::new_with_constructor(token_counts),
            request_max_generation_tokens: Family::new_with_constructor(token_counts),
            iteration_tokens: Family::new_with_constructor(iteration_tokens),
            preemptions: Family::default(),
            cache_config: Family::default(),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            success: Family::default(),
            running: Family::default(),
            waiting: Family::default(),
            kv_usage: Family::default(),
            gpu_cache_usage: Family::default(),
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
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds (the gap before each token after the \
             first).",
            m.time_per_output_token.clone(),
        );
        registry.register(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent waiting in a queue for pages or compute, in seconds.",
            m.queue_time.clone(),
        );
        registry.register(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request: from decode's grant to the \
             first token.",
            m.prefill_time.clone(),
        );
        registry.register(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request: from the first token to the \
             last.",
            m.decode_time.clone(),
        );
        registry.register(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request: from decode's grant to the \
             last token.",
            m.inference_time.clone(),
        );
        registry.register(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of generation tokens: the most any one choice of a \
             request generated.",
            m.request_max_generation_tokens.clone(),
        );
        // A histogram whose name ends in `_total`, as vLLM's does.
        registry.register(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            m.iteration_tokens.clone(),
        );
        registry.register(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            m.preemptions.clone(),
        );
        registry.register(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            m.cache_config.clone(),
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
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use \
             vllm:kv_cache_usage_perc instead.",
            m.gpu_cache_usage.clone(),
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

    /// Shows the request-level series (the router's) at zero before any request, as vLLM's
    /// are, so that a dashboard finds every name from the start.
    pub fn show_request_series(&self) {
        let l = &self.labels;
        for h in [
            &self.e2e,
            &self.ttft,
            &self.inter_token,
            &self.time_per_output_token,
            &self.prefill_time,
            &self.decode_time,
            &self.inference_time,
            &self.request_prompt_tokens,
            &self.request_generation_tokens,
            &self.request_max_generation_tokens,
        ] {
            drop(h.get_or_create(l));
        }
        self.prompt_tokens.get_or_create(l).inc_by(0);
        self.generation_tokens.get_or_create(l).inc_by(0);
    }

    /// Shows the engine-level series (the workers') at zero before any step, as vLLM's are.
    pub fn show_engine_series(&self) {
        let l = &self.labels;
        for h in [&self.queue_time, &self.iteration_tokens] {
            drop(h.get_or_create(l));
        }
        for c in [&self.preemptions, &self.prefix_queries, &self.prefix_hits] {
            c.get_or_create(l).inc_by(0);
        }
        self.running.get_or_create(l).set(0);
        self.waiting.get_or_create(l).set(0);
        self.kv_usage.get_or_create(l).set(0.0);
        self.gpu_cache_usage.get_or_create(l).set(0.0);
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
        self.time_per_output_token
            .get_or_create(&self.labels)
            .observe(secs);
    }

    /// Every choice of one prompt of a request ended; the one that generated most generated
    /// `most_generated` tokens.
    pub fn request_finished(&self, most_generated: u64) {
        self.request_max_generation_tokens
            .get_or_create(&self.labels)
            .observe(most_generated as f64);
    }

    /// One engine step (a batched decode step, a prefill or recompute chunk) computed `tokens`.
    pub fn iteration(&self, tokens: usize) {
        self.iteration_tokens
            .get_or_create(&self.labels)
            .observe(tokens as f64);
    }

    /// A sequence was preempted.
    pub fn preempted(&self) {
        self.preemptions.get_or_create(&self.labels).inc();
    }

    /// The KV cache this engine runs with (set once, at start).
    pub fn set_cache_config(&self, c: CacheConfig) {
        self.cache_config
            .get_or_create(&CacheConfigLabels {
                model_name: self.labels.model_name.clone(),
                engine: self.labels.engine,
                block_size: c.block_size.to_string(),
                num_gpu_blocks: c.num_blocks.to_string(),
                // Pages hold f16 keys and values whatever the model's weights.
                cache_dtype: "float16",
                enable_prefix_caching: if c.prefix_caching { "True" } else { "False" },
            })
            .set(1);
    }

    /// A request finished (stop, length or abort by a worker).
    pub fn finished(&self, r: FinishedRequest) {
        self.e2e.get_or_create(&self.labels).observe(r.e2e_seconds);
        if let Some(t) = r.running {
            self.prefill_time
                .get_or_create(&self.labels)
                .observe(t.prefill_seconds);
            self.decode_time
                .get_or_create(&self.labels)
                .observe(t.decode_seconds);
            self.inference_time
                .get_or_create(&self.labels)
                .observe(t.prefill_seconds + t.decode_seconds);
        }
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
        // vLLM's older name of the same value, which its example dashboard still reads.
        self.gpu_cache_usage
            .get_or_create(&self.labels)
            .set(used_share);
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
            running: None,
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

    #[test]
    fn token_count_buckets_are_vllms_one_two_five_series() {
        assert_eq!(
            one_two_five(100),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(one_two_five(1), vec![1.0]);
        assert_eq!(
            one_two_five(TOKEN_BUCKETS_MAX).last(),
            Some(&(TOKEN_BUCKETS_MAX as f64))
        );
    }

    #[test]
    fn the_phases_preemptions_steps_and_cache_config_render_under_vllms_names() {
        let m = VllmMetrics::new("smol", "decode");
        m.finished(FinishedRequest {
            prompt_tokens: 4,
            generation_tokens: 3,
            e2e_seconds: 2.0,
            running: Some(RunningTimes {
                prefill_seconds: 0.25,
                decode_seconds: 1.5,
            }),
            finished_reason: "stop",
        });
        m.next_token(0.02);
        m.request_finished(7);
        m.iteration(12);
        m.preempted();
        m.preempted();
        m.set_kv_usage(0.5);
        m.set_cache_config(CacheConfig {
            block_size: 16,
            num_blocks: 64,
            prefix_caching: true,
        });
        let text = encode(&[m.registry()]);
        let labels = "{model_name=\"smol\",engine=\"decode\"}";
        let got = |name: &str| sample_value(&text, &format!("{name}{labels}"));
        assert_eq!(got("vllm:request_prefill_time_seconds_sum"), Some(0.25));
        assert_eq!(got("vllm:request_decode_time_seconds_sum"), Some(1.5));
        assert_eq!(got("vllm:request_inference_time_seconds_sum"), Some(1.75));
        assert_eq!(got("vllm:time_per_output_token_seconds_count"), Some(1.0));
        assert_eq!(got("vllm:request_max_num_generation_tokens_sum"), Some(7.0));
        assert_eq!(got("vllm:iteration_tokens_total_sum"), Some(12.0));
        assert_eq!(got("vllm:num_preemptions_total"), Some(2.0));
        assert_eq!(got("vllm:gpu_cache_usage_perc"), Some(0.5));
        assert_eq!(got("vllm:kv_cache_usage_perc"), Some(0.5));
        assert_eq!(
            sample_value(
                &text,
                "vllm:cache_config_info{model_name=\"smol\",engine=\"decode\",block_size=\"16\",\
                 num_gpu_blocks=\"64\",cache_dtype=\"float16\",enable_prefix_caching=\"True\"}"
            ),
            Some(1.0),
            "{text}"
        );
        // vLLM's boundaries: 12 tokens fall in the 16 bucket, not the 8 one.
        let bucket = |le: &str| {
            sample_value(
                &text,
                &format!(
                    "vllm:iteration_tokens_total_bucket{{le=\"{le}\",model_name=\"smol\",\
                     engine=\"decode\"}}"
                ),
            )
        };
        assert_eq!(bucket("8.0"), Some(0.0), "{text}");
        assert_eq!(bucket("16.0"), Some(1.0));
        assert_eq!(bucket("16384.0"), Some(1.0));
        assert!(
            text.contains("vllm:request_prefill_time_seconds_bucket{le=\"0.3\""),
            "{text}"
        );
    }
}
