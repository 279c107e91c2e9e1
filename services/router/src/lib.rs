//! Pagewarden's router: OpenAI-compatible HTTP in front, admission against the effective context
//! (I3), dispatch to a decode and a prefill worker over gRPC, and cancellation of both halves (I6).
//!
//! - `config.rs`: flags (clap) over a toml file over defaults → `RouterConfig`
//! - `server.rs`: `AppState`, the route table, the `Info` poller, `serve(listener, state, shutdown)`
//! - `access.rs`: each request's root span (joined to a client's `traceparent`) and access line
//! - `tenants.rs`: API keys (hashed) → tenants, reloaded on SIGHUP; the auth middleware (401)
//! - `extract.rs`: body extractor: 413 / invalid UTF-8 / invalid JSON as OpenAI errors
//! - `params.rs`: typed field readers whose errors name the field
//! - `validation.rs`: `ValidCompletionRequest`, `ValidChatRequest` (parse, don't validate)
//! - `tools.rs`: `tools`/`tool_choice` (`ToolRequest`), forced calls as output constraints, `ToolReader` (a reply's calls, whole or streamed)
//! - `frontend.rs`: tokenizer and chat template → prompt tokens
//! - `admission.rs`: prompt + max_tokens against the effective context; default `max_tokens`
//! - `workers.rs`: worker channels, liveness from `Info`, effective context, least-loaded pick
//! - `discovery.rs`: where workers come from: fixed URLs, or `dns://` names re-resolved at each poll
//! - `disagg.rs`: the seam to the workers: `trait Disagg` (effective context, dispatch of one choice) and `GrpcDisagg`
//! - `in_memory.rs`: `InMemoryDisagg`, the seam without workers or model, for tests
//! - `dispatch.rs`: the request state enum: Reserve → Prefill → Generate → tokens (`Flight`, `GrpcDisagg`'s generation)
//! - `erasure.rs`: `DELETE /v1/cache`: the tenant's prefix cache erased on every worker, and its certificate
//! - `guard.rs`: `AbortGuard`, whose drop aborts both halves
//! - `choices.rs`: a request's `n` choices, each a `Flight` driven by its own task, the later ones after the first's prompt is cached
//! - `respond.rs`: the shared path from tokens to a response (full JSON or stream)
//! - `provenance.rs`: what one choice was computed over, as its workers reported it
//! - `receipt.rs`: signed isolation receipts (`X-Pagewarden-Receipt: 1`) built from the provenance
//! - `sse.rs`: OpenAI chunks as server-sent events, `[DONE]`
//! - `openai.rs`: response bodies, usage, model list
//! - `logprobs.rs`: token logprobs in the chat and legacy completions shapes
//! - `handlers.rs`: the HTTP handlers
//! - `tokenize.rs`: `/tokenize`, `/detokenize`, `/version` (no worker involved)
//! - `record.rs`: concurrency slot (429) and the per-request outcome count
//! - `token_rate.rs`: per-tenant tokens per minute (token buckets; 429 with `Retry-After`)
//! - `error.rs`: `RouterError` and its one mapping to status + OpenAI error body
//! - `metrics.rs`: `pagewarden_router_*` Prometheus metrics and vLLM's request metrics
//! - `telemetry.rs`: trace context into gRPC metadata
//! - `sample.rs`: `SampleSink`, the auditor's hook for samples and cache erasures (no-op default)
//! - `auditor_sink.rs`: `AuditorSampleSink`, the `SampleSink` that reports to the auditor (samples, erasures)
#![warn(missing_docs)]

// The defense switches are for the system tests' debug build only, never a release build.
#[cfg(all(feature = "unsafe-test-switches", not(debug_assertions)))]
compile_error!(
    "the `unsafe-test-switches` feature turns defenses off: debug test builds only, never a \
     release build"
);

pub mod access;
pub mod admission;
pub mod auditor_sink;
pub mod choices;
pub mod config;
pub mod disagg;
pub mod discovery;
pub mod dispatch;
pub mod erasure;
pub mod error;
pub mod extract;
pub mod frontend;
pub mod guard;
pub mod handlers;
pub mod in_memory;
pub mod logprobs;
pub mod metrics;
pub mod openai;
pub mod params;
pub mod provenance;
pub mod receipt;
pub mod record;
pub mod respond;
pub mod sample;
pub mod server;
pub mod sse;
pub mod telemetry;
pub mod tenants;
pub mod token_rate;
pub mod tokenize;
pub mod tools;
pub mod validation;
pub mod workers;

pub use auditor_sink::AuditorSampleSink;
pub use config::{Args, RouterConfig};
pub use error::{ErrorBody, RouterError};
pub use pagewarden_common::edge::EdgeLimits;
pub use sample::{NoSampling, ResponseSample, SampleSink};
pub use server::{router, serve, serve_with, AppState, Settings};
