//! Raw rustls configurations of one identity, for internal streams that are not gRPC (the KV
//! transfer connection): the same CA, certificate and key as the gRPC links, ring as the
//! crypto provider.

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::TlsMaterial;

/// A rustls configuration could not be built from the material.
#[derive(Debug, thiserror::Error)]
#[error("rustls configuration: {0}")]
pub struct RustlsError(String);

fn err(e: impl std::fmt::Display) -> RustlsError {
    RustlsError(e.to_string())
}

fn parts(
    m: &TlsMaterial,
) -> Result<
    (
        RootCertStore,
        Vec<CertificateDer<'static>>,
        PrivateKeyDer<'static>,
    ),
    RustlsError,
> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&m.ca_pem) {
        roots.add(c.map_err(err)?).map_err(err)?;
    }
    let chain = CertificateDer::pem_slice_iter(&m.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let key = PrivateKeyDer::from_pem_slice(&m.key_pem).map_err(err)?;
    Ok((roots, chain, key))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server that requires a client certificate signed by the suite CA.
pub fn rustls_server_config(m: &TlsMaterial) -> Result<Arc<ServerConfig>, RustlsError> {
    let (roots, chain, key) = parts(m)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(err)?;
    let cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(err)?;
    Ok(Arc::new(cfg))
}

/// A client that trusts only the suite CA and presents this identity.
pub fn rustls_client_config(m: &TlsMaterial) -> Result<Arc<ClientConfig>, RustlsError> {
    let (roots, chain, key) = parts(m)?;
    let cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(err)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(err)?;
    Ok(Arc::new(cfg))
}
