//! The `Prefill` gRPC service: admission (I3) before any allocation, then one job per call in
//! its own task. A dropped call or an `Abort` cancels the job, which cancels its transfer.

use std::collections::HashMap;
use std::sync::Arc;

use pagewarden_common::admission::Admission;
use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_common::telemetry::accept_trace_context;
use pagewarden_common::{AttemptId, RequestId};
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::prefill_server::Prefill;
use pagewarden_worker::{wire, WorkerError};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::grant;
use crate::job::{self, JobDeps};

/// Static figures for `Info`.
pub struct Static {
    pub node_id: String,
    pub model: String,
    pub admission: Admission,
    pub page_size: usize,
    /// The forward pass's arithmetic (see `Model::arithmetic`).
    pub arithmetic: String,
}

/// The service.
pub struct PrefillService {
    pub deps: Arc<JobDeps>,
    pub info: Arc<Static>,
    pub active: Arc<Mutex<HashMap<RequestId, (AttemptId, CancellationToken)>>>,
}

/// Removes the job from the active table when the call ends, however it ends.
struct ActiveGuard {
    active: Arc<Mutex<HashMap<RequestId, (AttemptId, CancellationToken)>>>,
    req: RequestId,
    attempt: AttemptId,
    metrics: Arc<WorkerMetrics>,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let mut a = self.active.lock();
        if a.get(&self.req)
            .is_some_and(|(att, _)| *att == self.attempt)
        {
            a.remove(&self.req);
        }
        self.metrics.set_active(a.len());
    }
}

#[tonic::async_trait]
impl Prefill for PrefillService {
    async fn prefill(
        &self,
        request: Request<pb::PrefillRequest>,
    ) -> Result<Response<pb::PrefillReply>, Status> {
        let span = tracing::info_span!("prefill.prefill");
        accept_trace_context(&span, request.metadata());
        let metrics = self.deps.metrics.clone();
        let admission = self.info.admission;
        let job = grant::parse(
            request.into_inner(),
            self.info.page_size,
            |prompt, max_tokens| {
                #[cfg(feature = "unsafe-test-switches")]
                if pagewarden_common::test_switches::TestSwitches::current()
                    .is_off(pagewarden_common::test_switches::Switch::WorkerAdmission)
                {
                    return Ok(());
                }
                admission
                    .check(prompt, max_tokens)
                    .map(|_| ())
                    .map_err(|r| {
                        metrics.rejection(r.reason());
                        metrics.request("rejected");
                        Status::from(WorkerError::Rejected(r))
                    })
            },
        )?;
        let cancel = CancellationToken::new();
        {
            let mut active = self.active.lock();
            if let Some((att, _)) = active.get(&job.req) {
                if *att >= job.attempt {
                    metrics.stale_message();
                    return Err(WorkerError::Stale(format!(
                        "prefill of attempt {} after {}",
                        job.attempt.0, att.0
                    ))
                    .into());
                }
            }
            active.insert(job.req, (job.attempt, cancel.clone()));
        }
        // The job, not the call, holds its place in `active` and does its own accounting:
        // a dropped call (client gone) cancels the job, which still runs to its end in its own
        // task (cancelling its transfer and draining), and is then counted and removed.
        let guard = ActiveGuard {
            active: self.active.clone(),
            req: job.req,
            attempt: job.attempt,
            metrics: metrics.clone(),
        };
        let _drop_cancels = cancel.clone().drop_guard();
        metrics.set_active(self.active.lock().len());
        let req = job.req;
        let deps = self.deps.clone();
        let handle = tokio::spawn(
            async move {
                let _guard = guard;
                let result = job::run(deps, job, cancel).await;
                match &result {
                    Ok(_) => metrics.request("ok"),
                    Err(WorkerError::Cancelled(_)) => metrics.request("aborted"),
                    Err(e) => {
                        tracing::warn!(request = %req, error = %e, "prefill failed");
                        metrics.request("error")
                    }
                }
                result
            }
            .instrument(span),
        );
        let result = handle
            .await
            .map_err(|e| WorkerError::Internal(format!("prefill job failed: {e}")))?;
        Ok(Response::new(result?))
    }

    async fn abort(
        &self,
        request: Request<pb::AbortRequest>,
    ) -> Result<Response<pb::AbortReply>, Status> {
        let m = request.into_inner();
        let (req, attempt) = grant::request_ref(m.req.as_ref())?;
        let found = match self.active.lock().get(&req) {
            Some((att, token)) if *att == attempt => {
                token.cancel();
                true
            }
            Some(_) => {
                self.deps.metrics.stale_message();
                false
            }
            None => false,
        };
        if found {
            tracing::info!(request = %req, reason = %m.reason, "prefill aborted");
        }
        Ok(Response::new(pb::AbortReply { found }))
    }

    async fn erase_cache(
        &self,
        request: Request<pb::EraseCacheRequest>,
    ) -> Result<Response<pb::EraseCacheReply>, Status> {
        let (tenant, namespace) = wire::erase_request(request.into_inner())?;
        let erasure = self.deps.prefix_log.erase(&tenant, &namespace);
        Ok(Response::new(wire::erase_reply(
            &self.info.node_id,
            "prefill",
            &erasure,
        )))
    }

    async fn info(
        &self,
        _request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::WorkerInfo>, Status> {
        let pool = &self.deps.pool;
        Ok(Response::new(pb::WorkerInfo {
            node_id: self.info.node_id.clone(),
            role: "prefill".into(),
            model: self.info.model.clone(),
            context_length: self.info.admission.advertised_context() as u32,
            pool_tokens: pool.capacity_tokens() as u64,
            page_size: self.info.page_size as u32,
            // Cached prefix pages no request reads are free for any allocation.
            free_pages: pool.available_pages() as u64,
            total_pages: pool.capacity_pages() as u64,
            active_requests: self.active.lock().len() as u32,
            transfer_addr: String::new(),
            version: env!("CARGO_PKG_VERSION").into(),
            arithmetic: self.info.arithmetic.clone(),
            queue_depth: self.deps.gate.queued() as u32,
        }))
    }
}
