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

/// ring, with TLS 1.3's AES-128-GCM first: both ends are ours, so this order decides the suite.
/// The transfer stream moves hundreds of MiB per long prompt; AES-128 runs 10 rounds where
/// AES-256 runs 14, at a security margin (128 bits) that matches the rest of the suite's
/// keys. The other suites stay, for a peer that offers only those.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != TLS13_AES_128_GCM_SHA256.suite());
    Arc::new(p)
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

#[cfg(test)]
mod tests {
    use super::super::{write_dev_suite, InternalTls, SuiteRole, TlsFlags};
    use super::*;
    use rustls::{ClientConnection, ServerConnection};

    fn material(dir: &std::path::Path, role: SuiteRole) -> Arc<TlsMaterial> {
        let suite = write_dev_suite(dir).unwrap();
        let flags = TlsFlags {
            tls_ca: Some(suite.ca()),
            tls_cert: Some(suite.cert(role)),
            tls_key: Some(suite.key(role)),
        };
        match InternalTls::load(&flags).unwrap() {
            InternalTls::Mutual(m) => m,
            InternalTls::Plaintext => unreachable!("files were given"),
        }
    }

    #[test]
    fn two_suite_members_agree_on_aes_128_gcm() {
        let dir = tempfile::tempdir().unwrap();
        let server = rustls_server_config(&material(dir.path(), SuiteRole::Decode)).unwrap();
        let client = rustls_client_config(&material(dir.path(), SuiteRole::Prefill)).unwrap();
        let name = rustls_pki_types::ServerName::try_from(SuiteRole::Decode.dns_name()).unwrap();
        let mut c = ClientConnection::new(client, name).unwrap();
        let mut s = ServerConnection::new(server).unwrap();
        // The handshake, in memory: each side's flight handed to the other until both are done.
        for _ in 0..10 {
            let mut wire = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut wire).unwrap();
            }
            s.read_tls(&mut wire.as_slice()).unwrap();
            s.process_new_packets().unwrap();
            wire.clear();
            while s.wants_write() {
                s.write_tls(&mut wire).unwrap();
            }
            c.read_tls(&mut wire.as_slice()).unwrap();
            c.process_new_packets().unwrap();
            if !c.is_handshaking() && !s.is_handshaking() {
                break;
            }
        }
        assert!(!s.is_handshaking(), "handshake did not finish");
        let suite = |n: Option<rustls::SupportedCipherSuite>| n.map(|s| s.suite());
        let want = Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert_eq!(suite(s.negotiated_cipher_suite()), want);
        assert_eq!(suite(c.negotiated_cipher_suite()), want);
    }
}
