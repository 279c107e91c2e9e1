//! One prefill job: forward pass over local pages, first-token sampling, and the KV transfer
//! into decode's granted pages, with cancellation checked between chunks and batches.
//!
//! ```text
//! Admitted ──gate: slot + pages──▶ Computing ──logits──▶ Transferring ──drain ack──▶ Done(manifest)
//!     │  (waits in the gate's queue)   │                      │
//!     └──── cancel / queue bound ──────┴──────── cancel ──────┴─▶ Cancelled (transfer cancelled + drained)
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_kvcache::GrantKey;
use pagewarden_kvcache::{KvPool, Owner, ReadablePages};
use pagewarden_model::{Sampled, Sampler};
use pagewarden_proto::v1 as pb;
use pagewarden_transfer::{BatchStatus, ManifestBuilder, PageWriteReq, SegmentId, TransferBackend};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::compute::Compute;
use crate::gate::{Admitted, Gate};
use crate::grant::ValidPrefill;
use crate::segments::Segments;

/// Everything a job needs, shared by all jobs.
pub struct JobDeps {
    pub compute: Compute,
    pub pool: KvPool,
    pub segments: Segments,
    pub gate: Arc<Gate>,
    pub metrics: Arc<WorkerMetrics>,
    pub chunk_tokens: usize,
    pub batch_pages: usize,
    /// The model's end-of-generation tokens (`min_tokens` masks them).
    pub eog: Vec<u32>,
}

/// Runs one admitted job to its end.
pub async fn run(
    deps: Arc<JobDeps>,
    job: ValidPrefill,
    cancel: CancellationToken,
) -> Result<pb::PrefillReply, Status> {
    let owner = Owner {
        request: job.req,
        tenant: job.tenant.clone(),
    };
    let Admitted { pages, slot } = match deps.gate.admit(owner, job.prompt.len(), &cancel).await {
        Ok(a) => a,
        Err(refused) => {
            abandon_grant(&deps, &job).await;
            return Err(refused.status());
        }
    };
    let result = compute_and_send(&deps, &job, pages, &cancel).await;
    // The pages were dropped inside: the next waiter finds them free.
    drop(slot);
    result
}

/// The forward pass over the admitted pages, then the transfer; the pages are released when
/// this returns.
async fn compute_and_send(
    deps: &Arc<JobDeps>,
    job: &ValidPrefill,
    pages: ReadablePages,
    cancel: &CancellationToken,
) -> Result<pb::PrefillReply, Status> {
    let started = Instant::now();
    let (pages, first) = match compute(deps, job, pages, cancel).await {
        Ok(done) => done,
        Err(s) => {
            abandon_grant(deps, job).await;
            return Err(s);
        }
    };
    deps.metrics
        .observe_prefill(started.elapsed().as_secs_f64());
    let t0 = Instant::now();
    let (manifest, bytes) = transfer(deps, job, &pages, cancel).await?;
    drop(pages);
    let secs = t0.elapsed();
    deps.metrics.observe_transfer(bytes, secs.as_secs_f64());
    Ok(pb::PrefillReply {
        req: Some(pb::RequestRef {
            request_id: job.req.as_bytes().to_vec(),
            attempt: job.attempt.0,
        }),
        manifest: Some(pb::CommitManifest {
            grant_key: manifest.key.0.to_vec(),
            tokens_written: manifest.tokens_written as u32,
            page_checksums: manifest.page_checksums,
            digest: manifest.digest,
        }),
        first_token: first.token,
        transfer_bytes: bytes,
        transfer_micros: secs.as_micros() as u64,
        first_logprobs: first
            .logprobs
            .as_ref()
            .map(pagewarden_worker::wire::logprobs),
    })
}

fn cancelled() -> Status {
    Status::cancelled("prefill aborted")
}

/// How long a drain or cancel waits for decode's acknowledgement (and an unused grant's
/// connection for its set-up) before the job gives up: the connection is then dropped, decode
/// declares this peer gone, and frees what the grant held.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Cancels `key` (which drains it); if decode does not acknowledge in time, drops the
/// connection so the job ends and decode releases the grant's pages as its peer is gone.
async fn cancel_grant(deps: &JobDeps, addr: &str, seg: SegmentId, key: GrantKey) {
    let acked = tokio::time::timeout(ACK_TIMEOUT, deps.segments.backend().cancel(seg, key)).await;
    match acked {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "KV grant cancel failed: dropping the connection");
            deps.segments.forget(addr, seg);
        }
        Err(_) => {
            tracing::warn!("KV grant cancel not acknowledged in time: dropping the connection");
            deps.segments.forget(addr, seg);
        }
    }
}

/// Ends a grant under which no page was sent (the job was cancelled or failed before its
/// transfer): a cancel, which drains, tells decode that nothing of it can still land, so decode
/// frees the reserved pages now instead of quarantining them when its drain timeout passes.
/// Best effort: if decode is unreachable its pages stay fenced until it declares this peer gone.
async fn abandon_grant(deps: &JobDeps, job: &ValidPrefill) {
    let g = &job.grant;
    match tokio::time::timeout(ACK_TIMEOUT, deps.segments.open(&g.transfer_addr)).await {
        Ok(Ok(seg)) => cancel_grant(deps, &g.transfer_addr, seg, g.key).await,
        Ok(Err(e)) => {
            tracing::warn!(request = %job.req, error = %e.message(), "could not end the unused KV grant")
        }
        Err(_) => {
            tracing::warn!(request = %job.req, "connecting to end the unused KV grant timed out")
        }
    }
}

/// Forward pass on a blocking thread, chunk by chunk, checking for cancellation in between.
async fn compute(
    deps: &Arc<JobDeps>,
    job: &ValidPrefill,
    mut pages: ReadablePages,
    cancel: &CancellationToken,
) -> Result<(ReadablePages, Sampled), Status> {
    let d = deps.clone();
    let prompt = job.prompt.clone();
    let sampling = job.sampling.clone();
    let cancel = cancel.clone();
    tokio::task::spawn_blocking(move || {
        let mut logits = Vec::new();
        for chunk in prompt.chunks(d.chunk_tokens) {
            if cancel.is_cancelled() {
                return Err(cancelled());
            }
            logits = d
                .compute
                .prefill(&mut pages, chunk)
                .map_err(|e| Status::internal(format!("prefill forward pass failed: {}", e.0)))?;
        }
        let first = Sampler::for_request(&sampling, &prompt, &d.eog).next(&logits);
        Ok((pages, first))
    })
    .await
    .map_err(|e| Status::internal(format!("prefill task failed: {e}")))?
}

/// Sends every page of the prompt into the granted pages in bounded batches; ends the grant
/// with a drain, or with a cancel (which also drains) when aborted or failed.
async fn transfer(
    deps: &JobDeps,
    job: &ValidPrefill,
    pages: &ReadablePages,
    cancel: &CancellationToken,
) -> Result<(pagewarden_kvcache::CommitManifest, u64), Status> {
    let g = &job.grant;
    let backend = deps.segments.backend();
    let seg = deps.segments.open(&g.transfer_addr).await?;
    let mut manifest = ManifestBuilder::new(g.key);
    let mut bytes = 0u64;
    let indices: Vec<usize> = (0..g.pages.len()).collect();
    for batch in indices.chunks(deps.batch_pages.max(1)) {
        // Generation-checked page bytes: host memory on the CPU, device -> pinned host on a GPU.
        let frames = deps
            .compute
            .frames(pages, batch)
            .map_err(|e| Status::internal(e.0))?;
        let mut reqs = Vec::with_capacity(batch.len());
        for (&i, src) in batch.iter().zip(frames) {
            let (page, generation) = g.pages[i];
            reqs.push(PageWriteReq {
                dst_page: page,
                dst_generation: generation,
                tokens: g.tokens_in_page(i) as u32,
                src,
            });
        }
        bytes += reqs.iter().map(|r| r.src.len() as u64).sum::<u64>();
        let mut handle = match backend.submit_batch(seg, g.key, reqs) {
            Ok(h) => h,
            Err(e) => {
                deps.segments.forget(&g.transfer_addr, seg);
                return Err(Status::unavailable(format!("KV transfer failed: {e}")));
            }
        };
        let status = tokio::select! {
            s = handle.wait_ref() => s,
            () = cancel.cancelled() => {
                cancel_grant(deps, &g.transfer_addr, seg, g.key).await;
                return Err(cancelled());
            }
        };
        match status {
            // The manifest claims the checksums the transfer computed when it sent each page
            // (one hash per page on this side).
            BatchStatus::Completed { .. } => {
                manifest.add_sent(&handle);
            }
            BatchStatus::Pending | BatchStatus::Cancelled { .. } => {
                cancel_grant(deps, &g.transfer_addr, seg, g.key).await;
                return Err(cancelled());
            }
            BatchStatus::Failed(f) => {
                cancel_grant(deps, &g.transfer_addr, seg, g.key).await;
                return Err(Status::unavailable(format!("KV transfer failed: {f:?}")));
            }
        }
    }
    match tokio::time::timeout(ACK_TIMEOUT, backend.drain(seg, g.key)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            deps.segments.forget(&g.transfer_addr, seg);
            return Err(Status::unavailable(format!(
                "KV transfer drain failed: {e}"
            )));
        }
        Err(_) => {
            deps.segments.forget(&g.transfer_addr, seg);
            return Err(Status::unavailable(format!(
                "KV transfer drain not acknowledged within {ACK_TIMEOUT:?}"
            )));
        }
    }
    Ok((manifest.build(), bytes))
}
