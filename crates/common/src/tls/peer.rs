//! Who is calling: the roles a verified peer certificate names, and `RequireRole`, the tower
//! layer that checks every RPC's caller against the service's policy before the service sees
//! the request (I11).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use rustls_pki_types::{CertificateDer, DnsName, ServerName};
use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

use super::SuiteRole;

/// The roles `cert` names (its `<role>.pagewarden.internal` DNS SANs, checked with webpki's
/// own name matching). Call it only on a certificate whose chain was verified against the
/// suite CA (a handshake did that for a peer's certificate).
pub fn peer_roles(cert: &CertificateDer<'_>) -> Vec<SuiteRole> {
    let Ok(ee) = webpki::EndEntityCert::try_from(cert) else {
        return Vec::new();
    };
    SuiteRole::ALL
        .into_iter()
        .filter(|r| {
            let Ok(dns) = DnsName::try_from(r.dns_name()) else {
                return false;
            };
            ee.verify_is_valid_for_subject_name(&ServerName::DnsName(dns))
                .is_ok()
        })
        .collect()
}

/// The roles of the peer that sent `req` over mutual TLS; `None` when the connection carries
/// no verified certificate (plaintext).
pub fn peer_roles_of_request<B>(req: &http::Request<B>) -> Option<Vec<SuiteRole>> {
    let certs = req
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()?
        .peer_certs()?;
    certs.first().map(peer_roles)
}

/// Which roles may call a gRPC path (`/package.Service/Method`); an empty slice denies.
pub type RolePolicy = fn(&str) -> &'static [SuiteRole];

/// Standard gRPC health checks: any suite member may ask.
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// A tower layer that lets a request through only when its caller's certificate names a role
/// the policy allows for its path (PERMISSION_DENIED otherwise, UNAUTHENTICATED without a
/// certificate). With `enforce` false (a plaintext server: loopback, or
/// `--insecure-internal`) every request passes: there is no identity to check.
#[derive(Clone, Copy)]
pub struct RequireRole {
    policy: RolePolicy,
    enforce: bool,
}

impl RequireRole {
    /// Checks callers against `policy` when `enforce`.
    pub fn new(policy: RolePolicy, enforce: bool) -> Self {
        RequireRole { policy, enforce }
    }

    /// The refusal for a request to `path` from a peer with `roles`, if any.
    fn refusal(&self, path: &str, roles: Option<Vec<SuiteRole>>) -> Option<Status> {
        if !self.enforce {
            return None;
        }
        let Some(roles) = roles else {
            return Some(Status::unauthenticated(
                "no client certificate: internal calls need mutual TLS under the suite CA",
            ));
        };
        let allowed: &[SuiteRole] = if path.starts_with(HEALTH_PREFIX) {
            &SuiteRole::ALL
        } else {
            (self.policy)(path)
        };
        if roles.iter().any(|r| allowed.contains(r)) {
            return None;
        }
        let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
        tracing::warn!(path, caller = ?names, "internal call refused: role not allowed");
        Some(Status::permission_denied(format!(
            "{path} is not open to a caller with role(s) {names:?}"
        )))
    }
}

impl<S> tower::Layer<S> for RequireRole {
    type Service = RequireRoleService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequireRoleService { rule: *self, inner }
    }
}

/// The service [`RequireRole`] wraps around a gRPC router.
#[derive(Clone)]
pub struct RequireRoleService<S> {
    rule: RequireRole,
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for RequireRoleService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let refusal = self
            .rule
            .refusal(req.uri().path(), peer_roles_of_request(&req));
        match refusal {
            Some(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
            None => Box::pin(self.inner.call(req)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only_router(_: &str) -> &'static [SuiteRole] {
        &[SuiteRole::Router]
    }

    #[test]
    fn policy_decides_when_enforced() {
        let r = RequireRole::new(only_router, true);
        let p = "/pagewarden.v1.Decode/Reserve";
        assert!(r.refusal(p, Some(vec![SuiteRole::Router])).is_none());
        let denied = r.refusal(p, Some(vec![SuiteRole::Prefill])).unwrap();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            r.refusal(p, None).unwrap().code(),
            tonic::Code::Unauthenticated
        );
        assert!(r
            .refusal(
                "/grpc.health.v1.Health/Check",
                Some(vec![SuiteRole::Prefill])
            )
            .is_none());
        let off = RequireRole::new(only_router, false);
        assert!(off.refusal(p, None).is_none());
    }
}
