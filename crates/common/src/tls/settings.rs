//! TLS settings: the `--tls-ca/--tls-cert/--tls-key/--insecure-internal` flags and TOML keys,
//! the loaded PEM material, and the refusal to serve internal traffic in clear off loopback.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use super::{peer_roles, SuiteRole};

/// How long a TLS handshake on an internal listener may take before the socket is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Internal TLS flags, shared by every service (flatten into the service's clap parser and,
/// as the keys `tls_ca`, `tls_cert`, `tls_key`, into its settings).
#[derive(clap::Args, Debug, Clone, Default, Serialize, Deserialize)]
pub struct TlsFlags {
    /// PEM file of the suite CA: every internal peer must present a certificate it signed.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate (chain) of this service, naming its role (`<role>.pagewarden.internal`).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

/// The TLS settings could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Only some of the three files were given.
    #[error("internal TLS needs all three of --tls-ca, --tls-cert and --tls-key (missing {0})")]
    Incomplete(&'static str),
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM object of the expected kind.
    #[error("{what} {path} holds no PEM {expected}")]
    Pem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What was looked for.
        expected: &'static str,
    },
    /// The certificate names no suite role.
    #[error(
        "certificate {0} names no suite role (expected a DNS SAN such as decode.{domain})",
        domain = super::SUITE_DOMAIN
    )]
    NoRole(PathBuf),
    /// tonic refused the configuration.
    #[error("TLS configuration: {0}")]
    Tonic(String),
}

/// The PEM material of one service identity, read once at start-up.
#[derive(Clone)]
pub struct TlsMaterial {
    /// The suite CA certificate(s).
    pub ca_pem: Vec<u8>,
    /// This service's certificate chain.
    pub cert_pem: Vec<u8>,
    /// This service's private key.
    pub key_pem: Vec<u8>,
    /// The roles this service's certificate names.
    pub roles: Vec<SuiteRole>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TlsMaterial")
            .field("roles", &self.roles)
            .finish_non_exhaustive()
    }
}

/// How a service talks to the rest of the suite.
#[derive(Clone, Debug, Default)]
pub enum InternalTls {
    /// In clear, nothing authenticated: allowed on loopback, elsewhere only with
    /// `--insecure-internal`.
    #[default]
    Plaintext,
    /// Mutual TLS under the suite CA; every RPC's caller role is checked.
    Mutual(Arc<TlsMaterial>),
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

impl InternalTls {
    /// Loads the three files named by `flags`, or `Plaintext` when none is named.
    pub fn load(flags: &TlsFlags) -> Result<InternalTls, TlsError> {
        let (ca, cert, key) = match (&flags.tls_ca, &flags.tls_cert, &flags.tls_key) {
            (None, None, None) => return Ok(InternalTls::Plaintext),
            (Some(ca), Some(cert), Some(key)) => (ca, cert, key),
            (None, _, _) => return Err(TlsError::Incomplete("--tls-ca")),
            (_, None, _) => return Err(TlsError::Incomplete("--tls-cert")),
            (_, _, None) => return Err(TlsError::Incomplete("--tls-key")),
        };
        let ca_pem = read("CA certificate", ca)?;
        let cert_pem = read("certificate", cert)?;
        let key_pem = read("private key", key)?;
        let pem_err = |what, path: &Path, expected| TlsError::Pem {
            what,
            path: path.to_path_buf(),
            expected,
        };
        if CertificateDer::pem_slice_iter(&ca_pem)
            .filter_map(Result::ok)
            .next()
            .is_none()
        {
            return Err(pem_err("CA certificate", ca, "CERTIFICATE"));
        }
        let leaf = CertificateDer::pem_slice_iter(&cert_pem)
            .filter_map(Result::ok)
            .next()
            .ok_or_else(|| pem_err("certificate", cert, "CERTIFICATE"))?;
        PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|_| pem_err("private key", key, "PRIVATE KEY"))?;
        let roles = peer_roles(&leaf);
        if roles.is_empty() {
            return Err(TlsError::NoRole(cert.clone()));
        }
        Ok(InternalTls::Mutual(Arc::new(TlsMaterial {
            ca_pem,
            cert_pem,
            key_pem,
            roles,
        })))
    }

    /// Whether internal traffic is encrypted and authenticated.
    pub fn is_mutual(&self) -> bool {
        matches!(self, InternalTls::Mutual(_))
    }

    /// tonic's server configuration: this identity, clients must present a certificate the
    /// suite CA signed, handshakes bounded by [`HANDSHAKE_TIMEOUT`]. `None` in clear.
    pub fn server_config(&self) -> Option<ServerTlsConfig> {
        match self {
            InternalTls::Plaintext => None,
            InternalTls::Mutual(m) => Some(
                ServerTlsConfig::new()
                    .identity(Identity::from_pem(&m.cert_pem, &m.key_pem))
                    .client_ca_root(Certificate::from_pem(&m.ca_pem))
                    .timeout(HANDSHAKE_TIMEOUT),
            ),
        }
    }

    /// tonic's client configuration for calling a server of role `server`: its certificate
    /// must chain to the suite CA and name that role. `None` in clear.
    pub fn client_config(&self, server: SuiteRole) -> Option<ClientTlsConfig> {
        match self {
            InternalTls::Plaintext => None,
            InternalTls::Mutual(m) => Some(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(&m.ca_pem))
                    .identity(Identity::from_pem(&m.cert_pem, &m.key_pem))
                    .domain_name(server.dns_name())
                    .timeout(HANDSHAKE_TIMEOUT),
            ),
        }
    }
}

/// An internal listener would serve in clear where other hosts can reach it.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to serve {what} on {addr} without TLS: a non-loopback address is reachable from \
     other hosts. Pass --tls-ca, --tls-cert and --tls-key (mutual TLS under the suite CA), or \
     --insecure-internal to serve in clear on purpose"
)]
pub struct PlaintextRefused {
    /// Which listener.
    pub what: &'static str,
    /// Its address.
    pub addr: SocketAddr,
}

/// Refuses a plaintext listener on a non-loopback address unless `insecure_internal` (I11).
/// Loopback in clear is allowed (one machine, tests); TLS is allowed anywhere.
pub fn refuse_plaintext(
    what: &'static str,
    addr: SocketAddr,
    tls: &InternalTls,
    insecure_internal: bool,
) -> Result<(), PlaintextRefused> {
    match tls {
        InternalTls::Mutual(_) => Ok(()),
        InternalTls::Plaintext if addr.ip().is_loopback() => Ok(()),
        InternalTls::Plaintext if insecure_internal => {
            tracing::warn!(
                %addr,
                what,
                "--insecure-internal: serving in clear on a non-loopback address, unauthenticated"
            );
            Ok(())
        }
        InternalTls::Plaintext => Err(PlaintextRefused { what, addr }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_is_refused_off_loopback_unless_insecure() {
        let lo: SocketAddr = "127.0.0.1:7201".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7201".parse().unwrap();
        let p = InternalTls::Plaintext;
        assert!(refuse_plaintext("gRPC", lo, &p, false).is_ok());
        let e = refuse_plaintext("gRPC", any, &p, false).unwrap_err();
        assert!(e.to_string().contains("--insecure-internal"), "{e}");
        assert!(refuse_plaintext("gRPC", any, &p, true).is_ok());
    }

    #[test]
    fn partial_files_are_an_error() {
        let f = TlsFlags {
            tls_ca: Some("ca.pem".into()),
            ..Default::default()
        };
        assert!(matches!(
            InternalTls::load(&f),
            Err(TlsError::Incomplete("--tls-cert"))
        ));
        assert!(matches!(
            InternalTls::load(&TlsFlags::default()),
            Ok(InternalTls::Plaintext)
        ));
    }
}
