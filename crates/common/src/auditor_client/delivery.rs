//! Delivery: the one task that takes reports from the buffer and sends them to the auditor, in
//! order, keeping a report the auditor could not take *for now* until it does.
//!
//! ```text
//! buffer ─▶ send ──ack──────────────────────────────────▶ sent      (next report)
//!            │ ▲
//!            │ └─ wait (100 ms, doubling, at most 5 s) ◀── retryable: UNAVAILABLE (its database
//!            │                                             is down), transport error, no answer
//!            │                                             within SEND_TIMEOUT, ...
//!            └─ final: INVALID_ARGUMENT, PERMISSION_DENIED, ... ──▶ failed (next report)
//! ```
//!
//! While one report waits, later ones wait behind it in the bounded buffer, so an outage longer
//! than the buffer drops the newest reports (counted at `report`), never the oldest, and the
//! serving path still pays only a `try_send`. Delivery is at least once: a report the auditor
//! stored but whose answer was lost (timeout, cut connection) is sent again.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use pagewarden_proto::v1::auditor_client::AuditorClient as GrpcClient;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::{Counters, Report};

/// How long one send attempt may take before it is abandoned and tried again: longer than the
/// auditor takes to answer `UNAVAILABLE` when its database is down.
pub(super) const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// The wait before the first retry of a report; it doubles with every failed attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a failed attempt means for its report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// The auditor (or the way to it) failed: send the same report again later.
    Retry,
    /// The auditor refused the report itself: sending it again would be refused again.
    Drop,
}

/// Classifies a failed attempt by its status code.
fn verdict(code: Code) -> Verdict {
    match code {
        // UNAVAILABLE: the auditor's store failed, or it could not be reached. CANCELLED: tonic's
        // own request timeout. UNKNOWN: a connection cut mid-call.
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::Cancelled
        | Code::Unknown => Verdict::Retry,
        Code::Ok
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Internal
        | Code::DataLoss
        | Code::Unauthenticated => Verdict::Drop,
    }
}

/// Capped exponential backoff between attempts at one report.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            next: FIRST_BACKOFF,
        }
    }

    /// The wait before the next attempt.
    fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        wait
    }
}

/// One attempt at `r`, abandoned after [`SEND_TIMEOUT`] (a hung auditor counts as unavailable).
async fn send_once(grpc: &mut GrpcClient<Channel>, r: Report) -> Result<(), Status> {
    let call = async {
        match r {
            Report::Sample(s) => grpc.report_sample(s).await.map(drop),
            Report::Integrity(e) => grpc.report_integrity(e).await.map(drop),
            Report::Preflight(p) => grpc.report_preflight(p).await.map(drop),
            Report::Cache(c) => grpc.report_cache(c).await.map(drop),
            Report::Erasure(e) => grpc.report_erasure(e).await.map(drop),
            Report::Recompute(r) => grpc.report_recompute(r).await.map(drop),
        }
    };
    tokio::time::timeout(SEND_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(format!(
                "no answer within {SEND_TIMEOUT:?}"
            )))
        })
}

/// Sends every report from `rx`, in order, until every sender is gone and the buffer is empty.
pub(super) async fn send_loop(
    mut grpc: GrpcClient<Channel>,
    mut rx: mpsc::Receiver<Report>,
    counters: Arc<Counters>,
) {
    while let Some(r) = rx.recv().await {
        let mut backoff = Backoff::new();
        loop {
            let Err(status) = send_once(&mut grpc, r.clone()).await else {
                counters.sent.fetch_add(1, Ordering::Relaxed);
                break;
            };
            match verdict(status.code()) {
                Verdict::Retry => {
                    counters.retried.fetch_add(1, Ordering::Relaxed);
                    let wait = backoff.next_wait();
                    // Later reports wait behind this one: one warning per outage, not per try.
                    if wait == FIRST_BACKOFF {
                        tracing::warn!(%status, "auditor did not take a report; retrying it");
                    } else {
                        tracing::debug!(%status, ?wait, "auditor did not take a report; retrying");
                    }
                    tokio::time::sleep(wait).await;
                }
                Verdict::Drop => {
                    tracing::warn!(%status, "auditor refused a report; dropping it");
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;

    use pagewarden_proto::v1 as pb;
    use pagewarden_proto::v1::auditor_server::{Auditor, AuditorServer};
    use tokio::net::TcpListener;
    use tonic::transport::server::TcpIncoming;
    use tonic::{Request, Response};

    use super::*;
    use crate::auditor_client::{AuditorClient, ClientStats};

    /// An auditor whose database is down for its first `down_for` calls (`UNAVAILABLE`), that
    /// refuses reports from node `bad` (`INVALID_ARGUMENT`), and records the node of every
    /// report it takes.
    #[derive(Clone, Default)]
    struct FakeAuditor {
        down_for: Arc<AtomicU64>,
        calls: Arc<AtomicU64>,
        taken: Arc<Mutex<Vec<String>>>,
    }

    impl FakeAuditor {
        fn down_for(n: u64) -> Self {
            let fake = FakeAuditor::default();
            fake.down_for.store(n, Ordering::Relaxed);
            fake
        }

        fn take(&self, node: String) -> Result<Response<pb::ReportAck>, Status> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let down = self
                .down_for
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            if down.is_ok() {
                return Err(Status::unavailable("auditor store: database is down"));
            }
            if node == "bad" {
                return Err(Status::invalid_argument("node is bad"));
            }
            self.taken.lock().unwrap().push(node);
            Ok(Response::new(pb::ReportAck::default()))
        }

        fn taken(&self) -> Vec<String> {
            self.taken.lock().unwrap().clone()
        }

        /// Serves on `listener` until the test's runtime ends.
        fn serve(&self, listener: TcpListener) {
            let server = tonic::transport::Server::builder()
                .add_service(AuditorServer::new(self.clone()))
                .serve_with_incoming(TcpIncoming::from(listener));
            tokio::spawn(server);
        }
    }

    #[tonic::async_trait]
    impl Auditor for FakeAuditor {
        async fn report_sample(
            &self,
            r: Request<pb::SampleReport>,
        ) -> Result<Response<pb::ReportAck>, Status> {
            self.take(r.into_inner().node)
        }
        async fn report_integrity(
            &self,
            r: Request<pb::IntegrityReport>,
        ) -> Result<Response<pb::ReportAck>, Status> {
            self.take(r.into_inner().node)
        }
        async fn report_preflight(
            &self,
            r: Request<pb::PreflightReport>,
        ) -> Result<Response<pb::ReportAck>, Status> {
            self.take(r.into_inner().node)
        }
        async fn report_cache(
            &self,
            r: Request<pb::CacheReport>,
        ) -> Result<Response<pb::ReportAck>, Status> {
            self.take(r.into_inner().node)
        }
        async fn report_erasure(
            &self,
            r: Request<pb::ErasureReport>,
        ) -> Result<Response<pb::ReportAck>, Status> {
            self.take(r.into_inner().tenant)
        }
        async fn report_recompute(
            &self,
            r: Request<pb::RecomputeReport>,
        ) -> Result<Response<pb::ReportAck>, Status> {
            self.take(r.into_inner().tenant)
        }
        async fn issue_marker(
            &self,
            _: Request<pb::IssueMarkerRequest>,
        ) -> Result<Response<pb::Marker>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn list_markers(
            &self,
            _: Request<pb::ListMarkersRequest>,
        ) -> Result<Response<pb::ListMarkersReply>, Status> {
            Err(Status::unimplemented("fake"))
        }
    }

    async fn listener() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        (l, addr)
    }

    /// The client's stats once `done` holds of them; panics after 10 s.
    async fn stats_once(
        client: &AuditorClient,
        done: impl Fn(&ClientStats) -> bool,
    ) -> ClientStats {
        let started = std::time::Instant::now();
        loop {
            let s = client.stats();
            if done(&s) {
                return s;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "stuck at {s:?}"
            );
            // Real time: the reports travel over a real connection to the fake auditor.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn preflight(node: &str) -> pb::PreflightReport {
        pb::PreflightReport {
            node: node.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn reports_the_auditor_cannot_store_yet_arrive_once_and_in_order() {
        let fake = FakeAuditor::down_for(3);
        let (l, addr) = listener().await;
        fake.serve(l);
        let client = AuditorClient::spawn(&format!("http://{addr}"), 16).unwrap();
        assert!(client.report_preflight(preflight("n0")));
        assert!(client.report_integrity(pb::IntegrityReport {
            node: "n1".into(),
            ..Default::default()
        }));
        assert!(client.report_sample(pb::SampleReport {
            node: "n2".into(),
            ..Default::default()
        }));
        assert!(client.report_cache(pb::CacheReport {
            node: "n3".into(),
            ..Default::default()
        }));
        assert!(client.report_preflight(preflight("n4")));
        let s = stats_once(&client, |s| s.sent == 5).await;
        assert_eq!(fake.taken(), ["n0", "n1", "n2", "n3", "n4"]);
        assert_eq!((s.failed, s.dropped, s.retried, s.waiting()), (0, 0, 3, 0));
        assert_eq!(fake.calls.load(Ordering::Relaxed), 8);
    }

    #[tokio::test]
    async fn a_report_the_auditor_refuses_is_dropped_not_retried() {
        let fake = FakeAuditor::default();
        let (l, addr) = listener().await;
        fake.serve(l);
        let client = AuditorClient::spawn(&format!("http://{addr}"), 16).unwrap();
        client.report_preflight(preflight("bad"));
        client.report_preflight(preflight("good"));
        let s = stats_once(&client, |s| s.sent + s.failed == 2).await;
        assert_eq!((s.sent, s.failed, s.retried), (1, 1, 0));
        assert_eq!(fake.taken(), ["good"]);
        assert_eq!(fake.calls.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn an_auditor_that_comes_up_late_gets_what_the_buffer_held() {
        // Nothing listens on `addr` until the fake starts: every attempt is a transport error.
        let (l, addr) = listener().await;
        drop(l);
        let client = AuditorClient::spawn(&format!("http://{addr}"), 2).unwrap();
        assert!(client.report_preflight(preflight("n0")));
        stats_once(&client, |s| s.retried >= 2).await;
        // n0 is being retried; two more fit in the buffer and the rest are dropped, at once.
        let started = std::time::Instant::now();
        let queued: Vec<bool> = (1..6)
            .map(|i| client.report_preflight(preflight(&format!("n{i}"))))
            .collect();
        assert!(started.elapsed() < Duration::from_millis(50));
        assert_eq!(queued, [true, true, false, false, false]);
        let s = client.stats();
        assert_eq!((s.sent, s.failed, s.dropped, s.waiting()), (0, 0, 3, 3));

        let fake = FakeAuditor::default();
        fake.serve(TcpListener::bind(addr).await.unwrap());
        let s = stats_once(&client, |s| s.sent == 3).await;
        assert_eq!(fake.taken(), ["n0", "n1", "n2"]);
        assert_eq!((s.failed, s.dropped, s.waiting()), (0, 3, 0));
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let mut b = Backoff::new();
        let waits: Vec<u64> = (0..8).map(|_| b.next_wait().as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }

    #[test]
    fn only_the_auditors_own_failures_are_retried() {
        assert_eq!(verdict(Code::Unavailable), Verdict::Retry);
        assert_eq!(verdict(Code::DeadlineExceeded), Verdict::Retry);
        assert_eq!(verdict(Code::InvalidArgument), Verdict::Drop);
        assert_eq!(verdict(Code::PermissionDenied), Verdict::Drop);
        assert_eq!(verdict(Code::Unauthenticated), Verdict::Drop);
    }
}
