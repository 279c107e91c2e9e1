//! `AuditorClient`: how router and workers report to the auditor without ever waiting on it.
//!
//! Reports go into a bounded channel; one background task ([`delivery`]) sends them over gRPC,
//! in order. A report the auditor cannot take for now (it is down or restarting, or its database
//! is: `UNAVAILABLE`) is kept and retried with capped exponential backoff while later reports
//! wait in the channel; one it refuses as malformed or unauthorised is counted as failed and
//! dropped. When the channel is full a new report is dropped and counted. The serving path only
//! ever pays for a `try_send`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), pagewarden_common::auditor_client::ClientError> {
//! use pagewarden_common::auditor_client::AuditorClient;
//! let auditor = AuditorClient::spawn("http://127.0.0.1:7400", 1024)?;
//! auditor.report_preflight(pagewarden_proto::v1::PreflightReport::default());
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::cache_event::CacheEvent;
use crate::integrity::{IntegrityEvent, IntegritySink};
use crate::tls::{self, SuiteRole};
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::auditor_client::AuditorClient as GrpcClient;
use tokio::sync::mpsc;
use tonic::transport::Endpoint;

mod delivery;

/// One report on its way to the auditor.
#[derive(Clone, Debug)]
pub enum Report {
    /// A sampled response (router).
    Sample(pb::SampleReport),
    /// An integrity event (prefill, decode).
    Integrity(pb::IntegrityReport),
    /// A preflight result (prefill, decode).
    Preflight(pb::PreflightReport),
    /// A prefix-cache event (prefill, decode).
    Cache(pb::CacheReport),
    /// A tenant's prefix-cache erasure (router).
    Erasure(pb::ErasureReport),
    /// A served request for the recompute audit (router).
    Recompute(pb::RecomputeReport),
}

/// The client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The endpoint is not a valid URI.
    #[error("invalid auditor endpoint {0:?}: {1}")]
    Endpoint(String, String),
    /// A report sent with [`send_preflight_failure`] did not reach the auditor.
    #[error("the auditor did not take the report: {0}")]
    NotDelivered(String),
}

/// Counts of what happened to reports, since the client was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Accepted into the buffer.
    pub queued: u64,
    /// Dropped because the buffer was full.
    pub dropped: u64,
    /// Delivered and acknowledged.
    pub sent: u64,
    /// Refused by the auditor as the report's own fault (invalid, unauthorised) and dropped.
    pub failed: u64,
    /// Attempts that failed for a reason of the auditor's (down, its database down, no answer
    /// in time) and were followed by another attempt at the same report.
    pub retried: u64,
}

impl ClientStats {
    /// Reports accepted but not yet sent or refused: in the buffer, or being retried.
    pub fn waiting(&self) -> u64 {
        self.queued.saturating_sub(self.sent + self.failed)
    }
}

#[derive(Default)]
struct Counters {
    queued: AtomicU64,
    dropped: AtomicU64,
    sent: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
}

/// A cheap-to-clone handle that buffers reports for one background sender task.
#[derive(Clone)]
pub struct AuditorClient {
    tx: mpsc::Sender<Report>,
    counters: Arc<Counters>,
}

impl AuditorClient {
    /// Connects lazily to `endpoint` (e.g. `http://127.0.0.1:7400`) and starts the sender
    /// task on the current tokio runtime; at most `capacity` reports wait in the buffer.
    /// `http://` is assumed when `endpoint` names no scheme.
    pub fn spawn(endpoint: &str, capacity: usize) -> Result<Self, ClientError> {
        let ep = endpoint_of(endpoint)?
            .connect_timeout(Duration::from_secs(1))
            .timeout(delivery::SEND_TIMEOUT);
        let grpc = GrpcClient::new(ep.connect_lazy());
        let (client, rx) = Self::with_sink(capacity);
        tokio::spawn(delivery::send_loop(grpc, rx, client.counters.clone()));
        Ok(client)
    }

    /// A client whose reports land in the returned receiver instead of the network (tests,
    /// or an in-process auditor).
    pub fn with_sink(capacity: usize) -> (Self, mpsc::Receiver<Report>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            AuditorClient {
                tx,
                counters: Arc::default(),
            },
            rx,
        )
    }

    /// Buffers `r`; returns false (and counts a drop) when the buffer is full or the sender
    /// task is gone. Never waits.
    pub fn report(&self, r: Report) -> bool {
        match self.tx.try_send(r) {
            Ok(()) => {
                self.counters.queued.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(mpsc::error::TrySendError::Full(_)) | Err(mpsc::error::TrySendError::Closed(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Buffers a sampled response.
    pub fn report_sample(&self, s: pb::SampleReport) -> bool {
        self.report(Report::Sample(s))
    }

    /// Buffers an integrity event.
    pub fn report_integrity(&self, e: pb::IntegrityReport) -> bool {
        self.report(Report::Integrity(e))
    }

    /// Buffers a preflight result.
    pub fn report_preflight(&self, p: pb::PreflightReport) -> bool {
        self.report(Report::Preflight(p))
    }

    /// Queues a prefix-cache event; false when it was dropped.
    pub fn report_cache(&self, c: pb::CacheReport) -> bool {
        self.report(Report::Cache(c))
    }

    /// Queues a prefix-cache erasure's certificate; false when it was dropped.
    pub fn report_erasure(&self, e: pb::ErasureReport) -> bool {
        self.report(Report::Erasure(e))
    }

    /// Queues a served request for the recompute audit; false if it was dropped.
    pub fn report_recompute(&self, r: pb::RecomputeReport) -> bool {
        self.report(Report::Recompute(r))
    }

    /// What happened to reports so far.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            queued: self.counters.queued.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            sent: self.counters.sent.load(Ordering::Relaxed),
            failed: self.counters.failed.load(Ordering::Relaxed),
            retried: self.counters.retried.load(Ordering::Relaxed),
        }
    }
}

/// How long a worker that is about to exit waits for the auditor to take its failed preflight.
pub const FAILURE_REPORT_TIMEOUT: Duration = Duration::from_secs(3);

/// The auditor's gRPC endpoint, under this process's internal TLS identity
/// ([`tls::install_client_tls`]); `http://` is assumed when `endpoint` names no scheme.
fn endpoint_of(endpoint: &str) -> Result<Endpoint, ClientError> {
    tls::endpoint(endpoint, SuiteRole::Auditor, &tls::client_tls())
        .map_err(|e| ClientError::Endpoint(endpoint.to_string(), e.to_string()))
}

/// Sends a failed start-up (preflight refused, model unreadable, device unusable) to the
/// auditor and waits for it to be taken, for a worker that exits right after (I7, I8): the
/// buffered client would be torn down with the process before its sender ran.
pub async fn send_preflight_failure(
    endpoint: &str,
    node: &str,
    role: &str,
    why: &str,
) -> Result<(), ClientError> {
    let ep = endpoint_of(endpoint)?
        .connect_timeout(FAILURE_REPORT_TIMEOUT)
        .timeout(FAILURE_REPORT_TIMEOUT);
    let report = pb::PreflightReport {
        node: node.to_string(),
        role: role.to_string(),
        pool_tokens: 0,
        context_length: 0,
        ok: false,
        message: why.to_string(),
    };
    let send = async {
        let mut grpc = GrpcClient::new(ep.connect_lazy());
        grpc.report_preflight(report).await
    };
    match tokio::time::timeout(FAILURE_REPORT_TIMEOUT, send).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(ClientError::NotDelivered(status.to_string())),
        Err(_) => Err(ClientError::NotDelivered(format!(
            "no answer within {FAILURE_REPORT_TIMEOUT:?}"
        ))),
    }
}

/// For a worker that refuses to start (I7): reports `why` to the auditor at `endpoint`, when one
/// is configured, and waits for it to be taken (I8); a report that cannot be delivered is logged,
/// never turned into a second error.
pub async fn report_startup_failure(endpoint: Option<&str>, node: &str, role: &str, why: &str) {
    let Some(url) = endpoint else { return };
    if let Err(e) = send_preflight_failure(url, node, role, why).await {
        tracing::warn!(error = %e, "failed start-up not reported to the auditor");
    }
}

/// The wire form of a worker's successful start-up preflight (I7).
pub fn preflight_report(
    node: &str,
    role: &str,
    r: &crate::preflight::PreflightReport,
) -> pb::PreflightReport {
    let message = match r.lowered_from {
        Some(asked) => format!("context lowered from {asked} to fit the pool"),
        None => String::new(),
    };
    pb::PreflightReport {
        node: node.to_string(),
        role: role.to_string(),
        pool_tokens: r.pool_tokens as u64,
        context_length: u32::try_from(r.advertised_context).unwrap_or(u32::MAX),
        ok: true,
        message,
    }
}

/// Plugs an [`AuditorClient`] into the workers' [`IntegritySink`] hook.
#[derive(Clone)]
pub struct AuditorIntegritySink {
    client: AuditorClient,
}

impl AuditorIntegritySink {
    /// Reports through `client`.
    pub fn new(client: AuditorClient) -> Self {
        AuditorIntegritySink { client }
    }
}

impl IntegritySink for AuditorIntegritySink {
    fn report(&self, e: IntegrityEvent) {
        self.client.report_integrity(pb::IntegrityReport {
            kind: pb::IntegrityKind::from(e.kind) as i32,
            node: e.node_id,
            req: e
                .request
                .map(|r| pagewarden_proto::convert::request_ref(r, crate::AttemptId(0))),
            tenant: e.tenant.map(|t| t.as_str().to_string()).unwrap_or_default(),
            page: e.page.map(|t| t.page),
            generation: e.page.map(|t| t.generation),
            details: format!("[{}] {}", e.role, e.detail),
        });
    }

    fn cache(&self, e: CacheEvent) {
        self.client.report_cache(pb::CacheReport::from(&e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn full_buffer_drops_and_counts() {
        let (client, mut rx) = AuditorClient::with_sink(2);
        let sent: Vec<bool> = (0..5)
            .map(|_| client.report_preflight(pb::PreflightReport::default()))
            .collect();
        assert_eq!(sent, vec![true, true, false, false, false]);
        let s = client.stats();
        assert_eq!((s.queued, s.dropped), (2, 3));
        assert!(matches!(rx.recv().await, Some(Report::Preflight(_))));
    }

    #[tokio::test]
    async fn integrity_sink_maps_common_events() {
        let (client, mut rx) = AuditorClient::with_sink(4);
        let sink = AuditorIntegritySink::new(client);
        sink.report(IntegrityEvent {
            node_id: "decode-0".into(),
            role: "decode",
            kind: crate::integrity::IntegrityKind::CountMismatch,
            request: Some(crate::RequestId([3; 16])),
            tenant: Some(crate::TenantId::new("t")),
            page: Some(crate::integrity::PageTag {
                page: 7,
                generation: 3,
            }),
            detail: "wrote 15 of 16".into(),
        });
        let Some(Report::Integrity(r)) = rx.recv().await else {
            panic!("expected an integrity report");
        };
        assert_eq!(r.kind, pb::IntegrityKind::CountMismatch as i32);
        assert_eq!((r.page, r.generation), (Some(7), Some(3)));
        assert_eq!(r.tenant, "t");
        assert_eq!(r.req.unwrap().request_id, vec![3; 16]);
    }
}
