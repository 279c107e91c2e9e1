//! The service runtime every Pagewarden service shares: configuration, the HTTP edge, TLS,
//! telemetry, metrics, the auditor's client. The vocabulary below it (ids, namespaces,
//! admission, integrity kinds, cache events) is `pagewarden-types`, re-exported here under the
//! same module names.
//!
//! - `config`: the one configuration layer (flags > environment > TOML file > defaults) and
//!   its error; `worker_config`: the workers' settings on it, with one-machine defaults.
//! - `edge`: the HTTP edge of every client-facing listener: deadlines, connection caps (I14).
//! - `telemetry`: tracing subscriber, OTLP export, trace context in gRPC metadata.
//! - `metrics`: the workers' Prometheus metrics (`pagewarden_*`) and the `/metrics` server.
//! - `preflight`: start-up check of pool capacity against advertised context (I7).
//! - `shutdown`: SIGTERM / Ctrl-C as a cancellation token.
//! - `auditor_client`: `AuditorClient`, the bounded never-blocking sender of reports to the auditor.
//! - `integrity`: the `IntegritySink` hook through which workers report violations (I8).
//! - `receipt`: signing and verifying isolation receipts (Ed25519 over canonical JSON).
//! - `secret`: bearer secrets (API keys, tokens) and their SHA-256, the only form servers keep.
//! - `tenants`: the tenants file (hashed API keys → tenants) and clients' clear keys files.
//! - `tls`: the suite CA, per-role certificates, mutual TLS and per-RPC role checks (I11).
//! - `test_switches` (feature `unsafe-test-switches`, TEST-ONLY): `TestSwitches`, which
//!   defenses a test build of the binaries runs without.
//! - `vllm_metrics`: the `vllm:*` metrics (vLLM's names and labels) beside Pagewarden's own.
#![warn(missing_docs)]

pub mod auditor_client;
pub mod config;
pub mod edge;
pub mod integrity;
pub mod metrics;
pub mod preflight;
pub mod receipt;
pub mod secret;
pub mod shutdown;
pub mod telemetry;
pub mod tenants;
#[cfg(feature = "unsafe-test-switches")]
pub mod test_switches;
pub mod tls;
pub mod vllm_metrics;
pub mod worker_config;

pub use pagewarden_types::{admission, cache_event, hex, ids, namespace, reject_reason, seal_mode};
pub use pagewarden_types::{AttemptId, RequestId, TenantId};
