//! The one place a tonic client endpoint to another suite service is built, so that every
//! internal link gets the same TLS treatment; and the process-wide client identity that a
//! service installs once at start-up.

use std::sync::OnceLock;

use tonic::transport::Endpoint;

use super::{InternalTls, SuiteRole};

static CLIENT_TLS: OnceLock<InternalTls> = OnceLock::new();

/// Sets this process's identity for every internal client it will build. Call it once, from
/// `main`, right after the configuration is read; a second call is ignored (and logged).
pub fn install_client_tls(tls: InternalTls) {
    if CLIENT_TLS.set(tls).is_err() {
        tracing::warn!("internal client TLS installed twice; keeping the first");
    }
}

/// The identity installed by [`install_client_tls`]; plaintext when none was.
pub fn client_tls() -> InternalTls {
    CLIENT_TLS.get().cloned().unwrap_or_default()
}

/// An internal endpoint could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The URL does not parse.
    #[error("invalid internal URL {url:?}: {message}")]
    Url {
        /// The URL as given.
        url: String,
        /// Why.
        message: String,
    },
    /// An `https://` URL without TLS settings to speak it with.
    #[error("{0:?} asks for TLS but this service has no --tls-ca/--tls-cert/--tls-key")]
    HttpsWithoutTls(String),
    /// tonic refused the TLS configuration.
    #[error("TLS for {url:?}: {message}")]
    Tls {
        /// The URL.
        url: String,
        /// Why.
        message: String,
    },
}

/// The endpoint for calling a `server`-role service at `url` (`host:port`, `http://…` or
/// `https://…`). Under mutual TLS the scheme becomes `https`, the server's certificate must
/// chain to the suite CA and name `server`'s role, and this service presents its own; in
/// clear, `https://` is an error.
pub fn endpoint(
    url: &str,
    server: SuiteRole,
    tls: &InternalTls,
) -> Result<Endpoint, EndpointError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url);
    let scheme = match tls {
        InternalTls::Mutual(_) => "https",
        InternalTls::Plaintext if url.starts_with("https://") => {
            return Err(EndpointError::HttpsWithoutTls(url.to_string()))
        }
        InternalTls::Plaintext => "http",
    };
    let bad = |e: &dyn std::fmt::Display| EndpointError::Url {
        url: url.to_string(),
        message: e.to_string(),
    };
    let ep = Endpoint::from_shared(format!("{scheme}://{rest}")).map_err(|e| bad(&e))?;
    match tls.client_config(server) {
        None => Ok(ep),
        Some(cfg) => ep.tls_config(cfg).map_err(|e| EndpointError::Tls {
            url: url.to_string(),
            message: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_keeps_http_and_refuses_https() {
        let p = InternalTls::Plaintext;
        let ep = endpoint("127.0.0.1:7201", SuiteRole::Decode, &p).unwrap();
        assert_eq!(ep.uri().scheme_str(), Some("http"));
        assert!(matches!(
            endpoint("https://127.0.0.1:7201", SuiteRole::Decode, &p),
            Err(EndpointError::HttpsWithoutTls(_))
        ));
    }
}
