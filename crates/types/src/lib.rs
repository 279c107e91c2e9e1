//! The vocabulary every Pagewarden crate shares, with no runtime and no wire format: the KV
//! pool, the model and the transfer protocol use it without linking tokio, tonic or axum.
//! Conversions to and from the gRPC messages live in `pagewarden-proto` (`convert`).
//!
//! - `ids`: newtypes for request, tenant and attempt identifiers.
//! - `namespace`: prefix-cache namespaces, HMAC-SHA256 of a tenant (or a named shared
//!   namespace) under the suite secret (I10).
//! - `admission`: prompt + max_tokens against the effective context, before allocation (I3).
//! - `reject_reason`: why a worker refused a request (admission, or its bounded queue).
//! - `integrity`: the kinds of integrity event a worker reports and the auditor files (I8).
//! - `cache_event`: prefix-cache events a worker reports to the auditor (I10).
//! - `sampling`: `SamplingParams` and its `Grammar`, their limits and their one range check.
//! - `finish_reason`: why a generation ended.
//! - `hex`: the one hex rendering of bytes.
//! - `seal_mode`: what a sealed KV transfer frame protects (integrity, or confidentiality too).
//! - `unknown_value`: the error of parsing a text that names none of an enum's values.
//! - `worker_status`: one worker as the router's `/health` lists it (liveness, load, device).
#![warn(missing_docs)]

pub mod admission;
pub mod cache_event;
pub mod finish_reason;
pub mod hex;
pub mod ids;
pub mod integrity;
pub mod namespace;
pub mod reject_reason;
pub mod sampling;
pub mod seal_mode;
pub mod unknown_value;
pub mod worker_status;

pub use finish_reason::FinishReason;
pub use ids::{AttemptId, RequestId, TenantId};
pub use unknown_value::UnknownValue;
