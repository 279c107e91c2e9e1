//! Where the router's workers come from: a fixed URL each, or a DNS name that stands for all of
//! them (a compose service's name, a Kubernetes headless service), re-resolved at every poll.
//!
//! `--decode dns://decode:7201` means "every address `decode` resolves to, on port 7201": a
//! worker that starts is picked up at the next poll, one whose name stops resolving (its
//! container stopped, its pod is not ready) is dropped from the pool. A lookup that fails keeps
//! the last answer: the polls of those workers then say whether they still serve.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use futures::future::BoxFuture;

/// The URL scheme that names a DNS name instead of one worker.
pub const DNS_SCHEME: &str = "dns://";

/// How long one lookup may take before the last answer is kept.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// One entry of `--decode` / `--prefill`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// One worker at a fixed URL (`host:port`, `http://…`, `https://…`).
    Url(String),
    /// Every address `name` resolves to, on `port`.
    Dns {
        /// The DNS name.
        name: String,
        /// The workers' gRPC port.
        port: u16,
    },
}

/// A `dns://` entry that does not name a host and a port.
#[derive(Debug, thiserror::Error)]
#[error("`{0}`: a DNS source is dns://NAME:PORT (a name, a port from 1 to 65535, no path)")]
pub struct BadDnsSource(pub String);

impl Source {
    /// Parses one configured entry: `dns://NAME:PORT`, else a worker URL (checked when its
    /// channel is built).
    pub fn parse(entry: &str) -> Result<Self, BadDnsSource> {
        let Some(rest) = entry.strip_prefix(DNS_SCHEME) else {
            return Ok(Self::Url(entry.to_string()));
        };
        let bad = || BadDnsSource(entry.to_string());
        let (name, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
        if !name_ok || port == 0 {
            return Err(bad());
        }
        Ok(Self::Dns {
            name: name.to_string(),
            port,
        })
    }
}

/// Resolves a name to socket addresses. The system resolver in production; tests give their
/// own answers.
pub trait Resolve: Send + Sync + 'static {
    /// The addresses `name` has now, each with `port`.
    fn resolve(
        &self,
        name: &str,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<Vec<SocketAddr>>>;
}

/// The system's resolver (`getaddrinfo` through tokio): `/etc/hosts`, then DNS.
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(
        &self,
        name: &str,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<Vec<SocketAddr>>> {
        let name = name.to_string();
        Box::pin(async move { Ok(tokio::net::lookup_host((name, port)).await?.collect()) })
    }
}

/// The worker URLs a name stands for now, sorted and without repeats; `None` when the lookup
/// failed or timed out (the caller keeps what it had).
pub async fn lookup(resolver: &dyn Resolve, name: &str, port: u16) -> Option<BTreeSet<String>> {
    match tokio::time::timeout(LOOKUP_TIMEOUT, resolver.resolve(name, port)).await {
        Ok(Ok(addrs)) => Some(addrs.iter().map(|a| format!("http://{a}")).collect()),
        Ok(Err(e)) => {
            tracing::warn!(%name, error = %e, "worker name did not resolve; keeping the last answer");
            None
        }
        Err(_) => {
            tracing::warn!(%name, timeout = ?LOOKUP_TIMEOUT, "worker name lookup timed out; keeping the last answer");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_as_urls_or_dns_names() {
        assert_eq!(
            Source::parse("http://10.0.0.1:7201").unwrap(),
            Source::Url("http://10.0.0.1:7201".into())
        );
        assert_eq!(
            Source::parse("dns://decode.pw.svc.cluster.local:7201").unwrap(),
            Source::Dns {
                name: "decode.pw.svc.cluster.local".into(),
                port: 7201
            }
        );
        for bad in [
            "dns://decode",
            "dns://:7201",
            "dns://decode:0",
            "dns://decode:99999",
            "dns://decode:7201/path",
            "dns://de code:7201",
        ] {
            let e = Source::parse(bad).unwrap_err();
            assert!(e.to_string().contains("dns://NAME:PORT"), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn the_system_resolver_answers_for_a_literal_address() {
        let urls = lookup(&SystemResolver, "127.0.0.1", 7201).await.unwrap();
        assert_eq!(
            urls.into_iter().collect::<Vec<_>>(),
            ["http://127.0.0.1:7201"]
        );
    }
}
