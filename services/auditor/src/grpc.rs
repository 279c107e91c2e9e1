//! The `Auditor` gRPC service: parses each report into its `Valid*` type and hands it to the
//! engine. A store failure is `UNAVAILABLE`: the sender keeps the report and sends it again
//! later (`pagewarden_common::auditor_client`), so reports outlive a database outage; an invalid
//! report is `INVALID_ARGUMENT`, which the sender drops.
//! Under mutual TLS, [`caller_policy`] says which suite roles may call each RPC (I11).

use std::sync::Arc;

use pagewarden_common::tls::SuiteRole;
use pagewarden_common::TenantId;
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::auditor_server::Auditor;
use tonic::{Request, Response, Status};

use crate::engine::Engine;
use crate::ingest::{
    InvalidReport, ValidCacheEvent, ValidErasure, ValidIntegrity, ValidPreflight, ValidRecompute,
    ValidSample,
};
use crate::recompute::Recomputer;
use crate::store::{MarkerRecord, StoreError};

/// Which roles may call each RPC: samples and cache erasures come from routers, integrity events, preflight
/// reports and prefix-cache events from workers, and canary markers (which name every tenant's secrets) are issued and
/// listed only for routers and the auditor itself. Anything else is refused.
pub fn caller_policy(path: &str) -> &'static [SuiteRole] {
    const SVC: &str = "/pagewarden.v1.Auditor/";
    match path.strip_prefix(SVC) {
        Some("ReportSample") | Some("ReportErasure") | Some("ReportRecompute") => {
            &[SuiteRole::Router]
        }
        Some("ReportIntegrity") | Some("ReportPreflight") | Some("ReportCache") => {
            &[SuiteRole::Prefill, SuiteRole::Decode]
        }
        Some("IssueMarker") | Some("ListMarkers") => &[SuiteRole::Router, SuiteRole::Auditor],
        _ => &[],
    }
}

/// The gRPC face of an [`Engine`].
pub struct AuditorService {
    engine: Arc<Engine>,
    recompute: Option<Recomputer>,
}

impl AuditorService {
    /// Serves `engine`.
    pub fn new(engine: Arc<Engine>) -> Self {
        AuditorService {
            engine,
            recompute: None,
        }
    }

    /// Recompute reports go to `recompute` (without one they are counted as dropped).
    pub fn with_recompute(mut self, recompute: Option<Recomputer>) -> Self {
        self.recompute = recompute;
        self
    }

    fn store_failed(&self, e: StoreError) -> Status {
        self.engine.metrics().ingest_error();
        tracing::error!(error = %e, "storing a report failed");
        Status::unavailable(format!("auditor store: {e}"))
    }
}

fn invalid(e: InvalidReport) -> Status {
    Status::invalid_argument(e.0)
}

fn ack(n: usize) -> Response<pb::ReportAck> {
    Response::new(pb::ReportAck {
        incidents_opened: u32::try_from(n).unwrap_or(u32::MAX),
    })
}

fn marker_to_wire(m: MarkerRecord) -> pb::Marker {
    pb::Marker {
        marker: m.marker,
        tenant: m.tenant,
        issued_unix_ms: m.issued_at.0,
    }
}

#[tonic::async_trait]
impl Auditor for AuditorService {
    async fn report_sample(
        &self,
        req: Request<pb::SampleReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let s = ValidSample::try_from(req.into_inner()).map_err(invalid)?;
        let opened = self
            .engine
            .ingest_sample(s)
            .await
            .map_err(|e| self.store_failed(e))?;
        Ok(ack(opened.len()))
    }

    async fn report_integrity(
        &self,
        req: Request<pb::IntegrityReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let e = ValidIntegrity::try_from(req.into_inner()).map_err(invalid)?;
        let opened = self
            .engine
            .ingest_integrity(e)
            .await
            .map_err(|e| self.store_failed(e))?;
        Ok(ack(usize::from(opened.is_some())))
    }

    async fn report_preflight(
        &self,
        req: Request<pb::PreflightReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let p = ValidPreflight::try_from(req.into_inner()).map_err(invalid)?;
        let opened = self
            .engine
            .ingest_preflight(p)
            .await
            .map_err(|e| self.store_failed(e))?;
        Ok(ack(usize::from(opened.is_some())))
    }

    async fn report_cache(
        &self,
        req: Request<pb::CacheReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let e = ValidCacheEvent::try_from(req.into_inner()).map_err(invalid)?;
        self.engine
            .ingest_cache(e)
            .await
            .map_err(|e| self.store_failed(e))?;
        Ok(ack(0))
    }

    async fn report_erasure(
        &self,
        req: Request<pb::ErasureReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let e = ValidErasure::try_from(req.into_inner()).map_err(invalid)?;
        self.engine
            .ingest_erasure(e)
            .await
            .map_err(|e| self.store_failed(e))?;
        Ok(ack(0))
    }

    async fn report_recompute(
        &self,
        req: Request<pb::RecomputeReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let r = ValidRecompute::try_from(req.into_inner()).map_err(invalid)?;
        // Never waits: a full queue (or no recompute model) drops the report, counted; the
        // sender is not asked to send it again.
        let queued = self.recompute.as_ref().is_some_and(|q| q.submit(r));
        if !queued {
            self.engine.metrics().recompute_dropped();
        }
        Ok(ack(0))
    }

    async fn issue_marker(
        &self,
        req: Request<pb::IssueMarkerRequest>,
    ) -> Result<Response<pb::Marker>, Status> {
        let tenant = req.into_inner().tenant;
        if tenant.is_empty() {
            return Err(Status::invalid_argument("tenant is required"));
        }
        let m = self
            .engine
            .issue_marker(&TenantId::new(tenant))
            .await
            .map_err(|e| self.store_failed(e))?;
        Ok(Response::new(marker_to_wire(m)))
    }

    async fn list_markers(
        &self,
        req: Request<pb::ListMarkersRequest>,
    ) -> Result<Response<pb::ListMarkersReply>, Status> {
        let tenant = req.into_inner().tenant;
        let tenant = (!tenant.is_empty()).then_some(tenant);
        let markers = self
            .engine
            .store()
            .markers(tenant.as_deref())
            .await
            .map_err(|e| self.store_failed(e))?;
        Ok(Response::new(pb::ListMarkersReply {
            markers: markers.into_iter().map(marker_to_wire).collect(),
        }))
    }
}
