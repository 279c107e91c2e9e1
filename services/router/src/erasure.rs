//! `DELETE /v1/cache`: the calling tenant's prefix-cache namespace is erased on every worker
//! (prefill and decode each keep a cache), and the answer is a certificate: each worker's
//! counts and digest, and one digest over them all. The tenant comes from its API key and the
//! namespace is derived from the tenant, as for generation (I10): a tenant can erase only the
//! namespace its own requests use.
//!
//! Every configured worker is asked, live or not: a worker that does not confirm (down, no
//! answer within [`ERASE_TIMEOUT`], an error) makes the whole call a 503 naming it, never a
//! partial success. The workers that did answer have erased; erasing again is harmless.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagewarden_common::namespace::Namespace;
use pagewarden_common::TenantId;
use pagewarden_proto::v1 as pb;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Half, RouterError};
use crate::server::AppState;
use crate::telemetry::traced;
use crate::workers::{Worker, WorkerPool};

/// How long one worker has to answer an erasure: an index walk and a memset per page.
pub const ERASE_TIMEOUT: Duration = Duration::from_secs(10);

/// What one worker erased.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerErasure {
    /// The worker's node id.
    pub worker: String,
    /// `prefill` or `decode`.
    pub role: &'static str,
    /// Cached pages of the namespace taken out of its index.
    pub entries: u32,
    /// Of them, pages zeroed and freed at once.
    pub pages_zeroed: u32,
    /// Of them, pages a running request of the tenant still reads: unreachable now, zeroed
    /// when it lets go.
    pub pages_deferred: u32,
    /// The worker's SHA-256 over the erased `(page, generation)` copies, hex.
    pub digest: String,
}

/// The body of `DELETE /v1/cache`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CacheErasure {
    /// Always `cache.erasure`.
    pub object: &'static str,
    /// The tenant whose namespace was erased.
    pub tenant: String,
    /// The namespace's tag (8 hex digits, as the auditor shows it), never its key.
    pub namespace: String,
    /// Each worker's part, prefill workers first, in the router's order.
    pub workers: Vec<WorkerErasure>,
    /// SHA-256 over every worker's role, node id and digest, in that order, hex.
    pub digest: String,
}

impl CacheErasure {
    /// The certificate of `workers`' erasures of `tenant`'s `namespace`.
    pub fn new(tenant: &TenantId, namespace: &Namespace, workers: Vec<WorkerErasure>) -> Self {
        let mut h = Sha256::new();
        h.update(b"pagewarden-cache-erasure-v1\0");
        h.update(namespace.as_bytes());
        for w in &workers {
            for part in [w.role, w.worker.as_str(), w.digest.as_str()] {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part.as_bytes());
            }
        }
        Self {
            object: "cache.erasure",
            tenant: tenant.as_str().to_string(),
            namespace: namespace.tag(),
            workers,
            digest: pagewarden_common::hex::encode(&h.finalize()),
        }
    }
}

/// `DELETE /v1/cache` (behind the API-key middleware).
pub async fn erase_cache(
    State(state): State<AppState>,
    Extension(tenant): Extension<TenantId>,
) -> Response {
    let namespace = state.tenants.namespace(&tenant);
    match state.disagg.erase_cache(&tenant, namespace).await {
        Ok(workers) => {
            let certificate = CacheErasure::new(&tenant, &namespace, workers);
            tracing::info!(
                tenant = %tenant,
                namespace = %certificate.namespace,
                workers = certificate.workers.len(),
                entries = certificate.workers.iter().map(|w| w.entries).sum::<u32>(),
                digest = %certificate.digest,
                "prefix cache erased"
            );
            state.sink.erased(&certificate);
            Json(certificate).into_response()
        }
        Err(e) => {
            tracing::warn!(tenant = %tenant, error = %e, "prefix cache erasure failed");
            e.into_response()
        }
    }
}

/// Asks every worker of `pool` to erase `namespace`; every one must confirm.
pub async fn erase_everywhere(
    pool: &WorkerPool,
    tenant: &TenantId,
    namespace: &Namespace,
) -> Result<Vec<WorkerErasure>, RouterError> {
    let mut workers = Vec::new();
    for half in [Half::Prefill, Half::Decode] {
        let of_half = pool.workers(half);
        if of_half.is_empty() {
            return Err(RouterError::NoLiveWorkers(half.as_str()));
        }
        workers.extend(of_half);
    }
    let request = pb::EraseCacheRequest {
        namespace: namespace.as_bytes().to_vec(),
        tenant: tenant.as_str().to_string(),
    };
    let answers = futures::future::join_all(
        workers
            .iter()
            .map(|w| tokio::time::timeout(ERASE_TIMEOUT, ask(w, request.clone()))),
    )
    .await;
    let mut done = Vec::with_capacity(workers.len());
    let mut failed = Vec::new();
    for (w, answer) in workers.iter().zip(answers) {
        let result = match answer {
            Ok(Ok(reply)) => erasure(w, reply),
            Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {ERASE_TIMEOUT:?}")),
        };
        match result {
            Ok(e) => done.push(e),
            Err(message) => failed.push((w, message)),
        }
    }
    match failed.first() {
        None => Ok(done),
        Some((w, message)) => Err(RouterError::EraseIncomplete {
            half: w.half(),
            worker: name(w),
            message: message.clone(),
            others: failed.len() - 1,
        }),
    }
}

async fn ask(
    w: &Arc<Worker>,
    m: pb::EraseCacheRequest,
) -> Result<pb::EraseCacheReply, tonic::Status> {
    let reply = match w.half() {
        Half::Decode => w.decode().erase_cache(traced(m)).await,
        Half::Prefill => w.prefill().erase_cache(traced(m)).await,
    };
    reply.map(tonic::Response::into_inner)
}

/// A worker's reply as its part of the certificate; an error when it is not one.
fn erasure(w: &Worker, r: pb::EraseCacheReply) -> Result<WorkerErasure, String> {
    if r.digest.len() != 32 {
        return Err(format!("its digest has {} bytes, not 32", r.digest.len()));
    }
    if r.entries != r.pages_zeroed.saturating_add(r.pages_deferred) {
        return Err(format!(
            "it erased {} entries but zeroed {} pages and deferred {}",
            r.entries, r.pages_zeroed, r.pages_deferred
        ));
    }
    Ok(WorkerErasure {
        worker: if r.node_id.is_empty() {
            w.url().to_string()
        } else {
            r.node_id
        },
        role: w.half().as_str(),
        entries: r.entries,
        pages_zeroed: r.pages_zeroed,
        pages_deferred: r.pages_deferred,
        digest: pagewarden_common::hex::encode(&r.digest),
    })
}

/// How an error names a worker: its node id when a poll has told it, and its URL.
fn name(w: &Worker) -> String {
    match w.live_info() {
        Some(info) => format!("{} ({})", info.node_id, w.url()),
        None => w.url().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewarden_common::namespace::{NamespaceSecret, Placement};

    fn part(worker: &str, role: &'static str, digest: &str) -> WorkerErasure {
        WorkerErasure {
            worker: worker.into(),
            role,
            entries: 1,
            pages_zeroed: 1,
            pages_deferred: 0,
            digest: digest.into(),
        }
    }

    #[test]
    fn the_certificate_digest_covers_every_worker_and_the_namespace() {
        let secret = NamespaceSecret::from_bytes(&[1; 32]);
        let a = TenantId::new("a");
        let ns = Namespace::derive(&secret, Placement::Private(&a));
        let other = Namespace::derive(&secret, Placement::Private(&TenantId::new("b")));
        let parts = vec![part("p0", "prefill", "aa"), part("d0", "decode", "bb")];
        let c = CacheErasure::new(&a, &ns, parts.clone());
        assert_eq!((c.object, c.tenant.as_str()), ("cache.erasure", "a"));
        assert_eq!(c.namespace, ns.tag());
        assert_eq!(c.digest.len(), 64);
        assert_eq!(c, CacheErasure::new(&a, &ns, parts.clone()));
        assert_ne!(
            c.digest,
            CacheErasure::new(&a, &other, parts.clone()).digest
        );
        let changed = vec![part("p0", "prefill", "aa"), part("d0", "decode", "bc")];
        assert_ne!(c.digest, CacheErasure::new(&a, &ns, changed).digest);
        assert_ne!(
            c.digest,
            CacheErasure::new(&a, &ns, parts[..1].to_vec()).digest
        );
    }
}
