//! In-process reliability harness. Compiled ONLY into the `reliability_*` test
//! binaries: each includes it with `#[path = "../src/harness/mod.rs"] mod harness;` and the
//! test-only `unsafe-test-switches` feature of `pagewarden-kvcache` is enabled only in this
//! crate's `[dev-dependencies]`. It is deliberately not a module of the crate's library, so a
//! `cargo build --workspace` never unifies the switches into a service binary.
//!
//! - `markers.rs`: tenant markers and marker-derived KV page bytes; leak detection.
//! - `layers.rs`: the six defense layers on or off (`Layers`, by the binaries' `Switch`).
//! - `cluster.rs`: router admission → decode reserve + grant → prefill (synthetic marker KV)
//!   → transfer (memory backend, real frames) → decode commit → decode read, in one process.

pub mod cluster;
pub mod layers;
pub mod markers;
