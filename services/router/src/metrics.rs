//! The router's Prometheus metrics (`pagewarden_router_*`): requests by outcome, rejections by
//! reason, time to first token, inter-token latency, stale messages, aborts sent, live workers;
//! and vLLM's request-level metrics ([`VllmMetrics`]: latency, tokens, finish reasons).

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use pagewarden_common::edge::EdgeCounters;
use pagewarden_common::vllm_metrics::VllmMetrics;

/// How a request that reached a handler ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    /// Finished with `stop` or `length`.
    Completed,
    /// Refused before anything was sent to a worker (4xx, 429, 503 at admission).
    Rejected,
    /// Client went away before the end.
    Cancelled,
    /// A worker failed or the protocol broke.
    Failed,
    /// Ran past the deadline.
    TimedOut,
    /// A worker ended the stream with `abort`.
    Aborted,
}

/// Labels of `pagewarden_router_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `completions` or `chat`.
    pub endpoint: &'static str,
    /// How it ended.
    pub outcome: Outcome,
}

/// Labels of `pagewarden_router_rejections_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The error code (`context_length_exceeded`, `invalid_api_key`, ...).
    pub reason: &'static str,
}

/// Labels of `pagewarden_router_aborts_sent_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AbortLabels {
    /// `prefill` or `decode`.
    pub half: &'static str,
    /// `ok` (acknowledged), `error` (RPC failed) or `timeout`.
    pub result: &'static str,
}

/// Labels of `pagewarden_router_phase_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// `reserve`, `prefill` or `generate` ([`Phase::name`]).
    pub phase: &'static str,
}

/// Where a request's time to first token goes, phase by phase (they add up to the TTFT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// From arrival to decode's grant: parsing, admission, decode's queue.
    Reserve,
    /// From the grant to prefill's reply: prefill's queue, the prompt's compute, the KV transfer.
    Prefill,
    /// From prefill's reply to the first token: decode's commit check and the relay.
    Generate,
}

impl Phase {
    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Reserve => "reserve",
            Phase::Prefill => "prefill",
            Phase::Generate => "generate",
        }
    }
}

/// Labels of `pagewarden_router_live_workers`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
    /// `prefill` or `decode`.
    pub role: &'static str,
}

/// Every metric the router exports, registered in one registry.
pub struct Metrics {
    registry: Registry,
    /// Requests by endpoint and outcome.
    pub requests: Family<RequestLabels, Counter>,
    /// Requests refused, by reason.
    pub rejections: Family<ReasonLabels, Counter>,
    /// Seconds from arrival to the first token.
    pub ttft: Histogram,
    /// Seconds between consecutive tokens of one request.
    pub inter_token: Histogram,
    /// Seconds of each phase before the first token.
    pub phases: Family<PhaseLabels, Histogram>,
    /// Worker messages dropped because they named another request or attempt (I5).
    pub stale_messages: Counter,
    /// Abort RPCs sent, by half and result (I6).
    pub aborts: Family<AbortLabels, Counter>,
    /// Live workers by role.
    pub live_workers: Family<RoleLabels, Gauge>,
    /// The effective context (0 while no worker is live).
    pub effective_context: Gauge,
    /// Requests being served now.
    pub in_flight: Gauge,
    /// Client connections refused on accept and closed by the edge, by reason.
    pub edge: EdgeCounters,
    /// The same requests under vLLM's names.
    pub vllm: VllmMetrics,
}

impl Metrics {
    /// Creates and registers every metric; `model_name` labels the `vllm:*` ones.
    pub fn new(model_name: &str) -> Self {
        let mut registry = Registry::with_prefix("pagewarden_router");
        let requests = Family::<RequestLabels, Counter>::default();
        let rejections = Family::<ReasonLabels, Counter>::default();
        let ttft = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let inter_token = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let phases = Family::<PhaseLabels, Histogram>::new_with_constructor(phase_histogram);
        let stale_messages = Counter::default();
        let aborts = Family::<AbortLabels, Counter>::default();
        let live_workers = Family::<RoleLabels, Gauge>::default();
        let effective_context = Gauge::default();
        let in_flight = Gauge::default();
        let edge = EdgeCounters::default();
        registry.register(
            "requests",
            "Requests by endpoint and outcome",
            requests.clone(),
        );
        registry.register(
            "rejections",
            "Requests refused, by reason",
            rejections.clone(),
        );
        registry.register(
            "ttft_seconds",
            "Time from request arrival to the first token",
            ttft.clone(),
        );
        registry.register(
            "inter_token_latency_seconds",
            "Time between consecutive tokens of one request",
            inter_token.clone(),
        );
        registry.register(
            "phase_seconds",
            "Time of each phase before the first token: reserve (to decode's grant), prefill \
             (to prefill's reply), generate (to the first token)",
            phases.clone(),
        );
        registry.register(
            "stale_messages",
            "Worker messages dropped for naming another request or attempt",
            stale_messages.clone(),
        );
        registry.register("aborts_sent", "Abort RPCs sent to workers", aborts.clone());
        registry.register("live_workers", "Live workers by role", live_workers.clone());
        registry.register(
            "effective_context_tokens",
            "min over live workers of min(context_length, pool_tokens)",
            effective_context.clone(),
        );
        registry.register("in_flight", "Requests being served", in_flight.clone());
        edge.register(&mut registry);
        let vllm = VllmMetrics::new(model_name, "router");
        vllm.show_request_series();
        Self {
            registry,
            requests,
            rejections,
            ttft,
            inter_token,
            phases,
            stale_messages,
            aborts,
            live_workers,
            effective_context,
            in_flight,
            edge,
            vllm,
        }
    }

    /// Counts one finished request.
    pub fn request(&self, endpoint: &'static str, outcome: Outcome) {
        self.requests
            .get_or_create(&RequestLabels { endpoint, outcome })
            .inc();
    }

    /// Counts one rejection.
    pub fn reject(&self, reason: &'static str) {
        self.rejections
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// The Prometheus/OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        pagewarden_common::metrics::encode(&[&self.registry, self.vllm.registry()])
    }

    /// A request's first token, `secs` after its arrival.
    pub fn first_token(&self, secs: f64) {
        self.ttft.observe(secs);
        self.vllm.first_token(secs);
    }

    /// One phase before the first token took `secs`.
    pub fn phase(&self, phase: Phase, secs: f64) {
        self.phases
            .get_or_create(&PhaseLabels {
                phase: phase.name(),
            })
            .observe(secs);
    }

    /// A later token, `secs` after the one before.
    pub fn next_token(&self, secs: f64) {
        self.inter_token.observe(secs);
        self.vllm.next_token(secs);
    }
}

/// The buckets of each phase's histogram: the TTFT's.
fn phase_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}
