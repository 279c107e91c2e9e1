//! `Role`: which worker is running, for messages, telemetry and reports to the auditor.

/// A worker's identity: built by its binary, so `cuda_built` is that binary's own `cuda`
/// feature (not this crate's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Role {
    /// The role as the auditor and metrics name it: `prefill` or `decode`.
    pub name: &'static str,
    /// The binary (and package) name: `pagewarden-prefill` or `pagewarden-decode`.
    pub binary: &'static str,
    /// Whether the binary was built with its `cuda` feature (`cfg!(feature = "cuda")` there).
    pub cuda_built: bool,
}
