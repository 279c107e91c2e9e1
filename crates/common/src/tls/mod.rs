//! The suite's internal trust: one CA, one certificate per service identity, mutual TLS on
//! every internal gRPC link, and a role check on every RPC (I11).
//!
//! A certificate names its role twice in its subject alternative names: as the DNS name
//! `<role>.pagewarden.internal` (what clients verify a server against, and what
//! [`peer_roles`] reads through webpki's name check) and as the URI `spiffe://pagewarden/<role>`
//! (for operators' tooling). A certificate is only believed once its chain reached the suite
//! CA during the handshake.
//!
//! - `settings.rs`: `TlsFlags` (flags and TOML keys), `InternalTls` (loaded PEMs),
//!   the plaintext-listener refusal.
//! - `peer.rs`: `peer_roles` (roles of a verified peer certificate) and `RequireRole`, the
//!   per-RPC tower layer every gRPC server wears.
//! - `endpoint.rs`: `endpoint`, the one builder of tonic client endpoints, and the
//!   process-wide client identity.
//! - `rustls_config.rs`: raw rustls server/client configs (for streams that are not gRPC).
//! - `dev.rs`: a dev CA and per-role certificates (rcgen), for `pagewarden up` and tests.

mod dev;
mod endpoint;
mod peer;
mod rustls_config;
mod settings;

pub use dev::{write_dev_suite, DevSuite, DevSuiteError};
pub use endpoint::{client_tls, endpoint, install_client_tls, EndpointError};
pub use peer::{peer_roles, peer_roles_of_request, RequireRole, RequireRoleService, RolePolicy};
pub use rustls_config::{rustls_client_config, rustls_server_config, RustlsError};
pub use settings::{
    refuse_plaintext, InternalTls, PlaintextRefused, TlsError, TlsFlags, TlsMaterial,
};

/// The DNS suffix under which every role's name lives.
pub const SUITE_DOMAIN: &str = "pagewarden.internal";

/// A service identity of the suite, as its certificate names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SuiteRole {
    /// The HTTP edge: calls decode, prefill and the auditor.
    Router,
    /// Prefill workers: write KV into decode's granted pages, report to the auditor.
    Prefill,
    /// Decode workers: report to the auditor.
    Decode,
    /// The auditor (its prober runs in-process, under this identity).
    Auditor,
}

impl SuiteRole {
    /// Every role, in a fixed order.
    pub const ALL: [SuiteRole; 4] = [
        SuiteRole::Router,
        SuiteRole::Prefill,
        SuiteRole::Decode,
        SuiteRole::Auditor,
    ];

    /// `router`, `prefill`, `decode`, `auditor`.
    pub fn as_str(self) -> &'static str {
        match self {
            SuiteRole::Router => "router",
            SuiteRole::Prefill => "prefill",
            SuiteRole::Decode => "decode",
            SuiteRole::Auditor => "auditor",
        }
    }

    /// The DNS SAN that carries this role: `<role>.pagewarden.internal`.
    pub fn dns_name(self) -> String {
        format!("{}.{SUITE_DOMAIN}", self.as_str())
    }

    /// The URI SAN that names this role: `spiffe://pagewarden/<role>`.
    pub fn uri(self) -> String {
        format!("spiffe://pagewarden/{}", self.as_str())
    }
}

impl std::fmt::Display for SuiteRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
