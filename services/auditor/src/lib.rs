//! Pagewarden auditor: learns, without trusting status codes, whether any tenant's data reached
//! another tenant. Ingests samples, integrity events and preflight reports over gRPC, sends
//! canary probes through the router, keeps an incident log (SQLite or PostgreSQL), and serves
//! the operators' web UI with a JSON API behind it.
//!
//! - `accounts`: web UI operators (argon2) and JSON API tokens (SHA-256), with roles.
//! - `client`: `AuditorClient`, the bounded, never-blocking sender router and workers use.
//! - `config`: TOML file + flags.
//! - `domain`: enums mirroring the schema's CHECK constraints, ids, time.
//! - `engine`: reports → records + incidents.
//! - `grpc`: the `Auditor` gRPC service.
//! - `ingest`: wire messages → `Valid*` reports.
//! - `ks`: the two-sample Kolmogorov–Smirnov test of timing samples.
//! - `markers`: canary markers, scanning, the marker → tenant registry.
//! - `metrics`: Prometheus counters.
//! - `probe`: canary probe runs against the router.
//! - `recompute`: the recompute audit: served tokens scored again on a clean pass.
//! - `server`: starts everything; `Running` stops it.
//! - `store`: sqlx persistence over both backends.
//! - `tokens`: the `TokenCounter` used for probe token-count checks.
//! - `web`: HTML pages, JSON API, `/metrics`, `/health`.
#![warn(missing_docs)]

pub mod accounts;
pub mod client;
pub mod config;
pub mod domain;
pub mod engine;
pub mod grpc;
pub mod ingest;
pub mod ks;
pub mod markers;
pub mod metrics;
pub mod probe;
pub mod recompute;
pub mod server;
pub mod store;
pub mod tokens;
pub mod web;

pub use client::AuditorClient;
pub use config::Config;
pub use engine::Engine;
pub use server::{start, Running};
