//! Shared by every Pagewarden crate and service.
//!
//! - `ids`: newtypes for request, tenant, attempt and grant identifiers.
//! - `config`: the one configuration layer (flags > environment > TOML file > defaults) and
//!   its error; `worker_config`: the workers' settings on it, with one-machine defaults.
//! - `edge`: the HTTP edge of every client-facing listener: deadlines, connection caps (I14).
//! - `telemetry`: tracing subscriber, OTLP export, trace context in gRPC metadata.
//! - `metrics`: the workers' Prometheus metrics (`pagewarden_*`) and the `/metrics` server.
//! - `preflight`: start-up check of pool capacity against advertised context (I7).
//! - `admission`: prompt + max_tokens against the effective context, before allocation (I3).
//! - `shutdown`: SIGTERM / Ctrl-C as a cancellation token.
//! - `auditor_client`: `AuditorClient`, the bounded never-blocking sender of reports to the auditor.
//! - `integrity`: the `IntegritySink` hook through which workers report violations (I8).
//! - `namespace`: prefix-cache namespaces, HMAC-SHA256 of a tenant (or a named shared
//!   namespace) under the suite secret (I10).
//! - `secret`: bearer secrets (API keys, tokens) and their SHA-256, the only form servers keep.
//! - `tenants`: the tenants file (hashed API keys → tenants) and clients' clear keys files.
//! - `tls`: the suite CA, per-role certificates, mutual TLS and per-RPC role checks (I11).
//! - `test_switches` (feature `unsafe-test-switches`, TEST-ONLY): `TestSwitches`, which
//!   defenses a test build of the binaries runs without.
//! - `vllm_metrics`: the `vllm:*` metrics (vLLM's names and labels) beside Pagewarden's own.

pub mod admission;
pub mod auditor_client;
pub mod cache_event;
pub mod config;
pub mod edge;
pub mod ids;
pub mod integrity;
pub mod metrics;
pub mod namespace;
pub mod preflight;
pub mod seal_mode;
pub mod secret;
pub mod shutdown;
pub mod telemetry;
pub mod tenants;
#[cfg(feature = "unsafe-test-switches")]
pub mod test_switches;
pub mod tls;
pub mod vllm_metrics;
pub mod worker_config;

pub use ids::{AttemptId, RequestId, TenantId};
