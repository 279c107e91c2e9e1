//! Shared by every Pagewarden crate and service.
//!
//! - `ids`: newtypes for request, tenant, attempt and grant identifiers.

pub mod ids;

pub use ids::{AttemptId, RequestId, TenantId};
