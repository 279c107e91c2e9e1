//! `GrantWriter`: the one owner of a write grant's end on the sending side. It carries one
//! job's KV pages into decode's granted pages: pages are sent as soon as a chunk of the
//! forward pass completes them (a token's KV never changes once written), in bounded batches,
//! while the next chunk computes; the last, partial page goes at the end. The grant then ends
//! here and only here: with a drain (`finish`), with a cancel, which also drains (`abort`, a
//! failed batch, a writer dropped mid-way), or by dropping the connection when decode does not
//! acknowledge in time (decode then frees the grant as its peer is gone). A grant refused
//! before its writer opened ends with `GrantWriter::abandon`.
//!
//! ```text
//! open ──submit(pages 0..k)──▶ … ──finish: rest, settle, drain──▶ (manifest, bytes)
//!   └──── abort / failure / drop: cancel the grant (decode frees what it reserved) ────┘
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use pagewarden_kvcache::{CommitManifest, GrantKey, ReadablePages, SharedPages};
use pagewarden_transfer::{
    BatchHandle, BatchStatus, ManifestBuilder, PageWriteReq, SegmentId, TransferBackend,
};
use pagewarden_worker::WorkerError;
use tokio_util::sync::CancellationToken;

use crate::grant::{ReceivedGrant, ValidPrefill};
use crate::job::{cancelled, JobDeps};
use crate::segments::Segments;

/// How long a drain or cancel waits for decode's acknowledgement (and an unused grant's
/// connection for its set-up) before the job gives up: the connection is then dropped, decode
/// declares this peer gone, and frees what the grant held.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Batches submitted but not yet confirmed, at most, before the sender waits for the oldest
/// (bounds the page copies held for the wire).
const MAX_IN_FLIGHT: usize = 4;

/// The pages of one job's grant, sent as they become final: a cached prefix's pinned pages
/// first, then the job's own. Pages are counted in the job's sequence (its prefix's pages,
/// then its own); the grant starts after the pages decode already holds
/// (`grant.prefix_tokens`), so sequence page `j` is grant page `j - held`, and pages before
/// `held` are never sent.
pub struct GrantWriter<'a> {
    deps: &'a JobDeps,
    job: &'a ValidPrefill,
    prefix: Option<Arc<SharedPages>>,
    seg: SegmentId,
    manifest: ManifestBuilder,
    bytes: u64,
    /// Grant pages submitted so far (a prefix of the grant's pages).
    submitted: usize,
    /// Sequence pages decode already holds: the grant's page 0 is this sequence page.
    held: usize,
    /// Submitted batches, oldest first; confirmed ones join the manifest in this order.
    in_flight: VecDeque<BatchHandle>,
    /// The grant has ended (drained, cancelled or its connection dropped): `Drop` does nothing.
    ended: bool,
}

impl<'a> GrantWriter<'a> {
    /// Connects to the grant's decode transfer listener (an open connection is reused). When
    /// that fails the grant is abandoned before the error returns.
    pub async fn open(
        deps: &'a JobDeps,
        job: &'a ValidPrefill,
        prefix: Option<Arc<SharedPages>>,
    ) -> Result<Self, WorkerError> {
        let seg = match open_grant(deps, &job.grant).await {
            Ok(seg) => seg,
            Err(e) => {
                Self::abandon(deps, job).await;
                return Err(e);
            }
        };
        Ok(Self {
            deps,
            job,
            prefix,
            seg,
            manifest: ManifestBuilder::new(job.grant.key),
            bytes: 0,
            submitted: 0,
            held: job.grant.prefix_tokens / job.grant.page_size,
            in_flight: VecDeque::new(),
            ended: false,
        })
    }

    /// Ends a grant under which no page was sent and no connection is open (the job was
    /// refused or failed before its transfer began): a cancel, which drains, tells decode that
    /// nothing of it can still land, so decode frees the reserved pages now instead of
    /// quarantining them when its drain timeout passes. Best effort: if decode is unreachable
    /// its pages stay fenced until it declares this peer gone.
    pub async fn abandon(deps: &JobDeps, job: &ValidPrefill) {
        let g = &job.grant;
        match tokio::time::timeout(ACK_TIMEOUT, open_grant(deps, g)).await {
            Ok(Ok(seg)) => cancel_grant(&deps.segments, &g.transfer_addr, seg, g.key).await,
            Ok(Err(e)) => {
                tracing::warn!(request = %job.req, error = %e, "could not end the unused KV grant")
            }
            Err(_) => {
                tracing::warn!(request = %job.req, "connecting to end the unused KV grant timed out")
            }
        }
    }

    /// Sends the sequence's pages up to (not including) page `upto` that are not sent yet (nor
    /// held by decode), in batches, waiting for the oldest batches when too many are in
    /// flight. On an error the grant is already ended.
    pub async fn send_upto(
        &mut self,
        pages: &ReadablePages,
        upto: usize,
        cancel: &CancellationToken,
    ) -> Result<(), WorkerError> {
        self.send(Some(pages), upto, cancel).await
    }

    /// Sends the cached prefix's pages (final before the job computes anything), so that the
    /// transfer runs while the rest of the prompt computes.
    pub async fn send_prefix(&mut self, cancel: &CancellationToken) -> Result<(), WorkerError> {
        let shared = self.prefix.as_ref().map_or(0, |p| p.table().len());
        self.send(None, shared, cancel).await
    }

    /// [`GrantWriter::send_upto`], the job's own pages given when `upto` reaches past the prefix.
    async fn send(
        &mut self,
        pages: Option<&ReadablePages>,
        upto: usize,
        cancel: &CancellationToken,
    ) -> Result<(), WorkerError> {
        let upto = upto
            .saturating_sub(self.held)
            .min(self.job.grant.pages.len());
        while self.submitted < upto {
            let end = (self.submitted + self.deps.batch_pages.max(1)).min(upto);
            let batch: Vec<usize> = (self.submitted..end).collect();
            self.submit(pages, &batch)?;
            self.submitted = end;
            self.settle(MAX_IN_FLIGHT, cancel).await?;
        }
        Ok(())
    }

    /// Sends the rest of the pages, waits for every batch, and drains the grant: the manifest
    /// of every page sent, and the bytes sent.
    pub async fn finish(
        mut self,
        pages: &ReadablePages,
        cancel: &CancellationToken,
    ) -> Result<(CommitManifest, u64), WorkerError> {
        // The job's pages end where the grant does, but never past what was computed (only a
        // test build that switched worker admission off computes less than the prompt).
        let computed = self.prefix.as_ref().map_or(0, |p| p.table().len()) + pages.table().len();
        self.send_upto(
            pages,
            (self.held + self.job.grant.pages.len()).min(computed),
            cancel,
        )
        .await?;
        self.settle(0, cancel).await?;
        self.ended = true;
        let addr = &self.job.grant.transfer_addr;
        let drained = tokio::time::timeout(
            ACK_TIMEOUT,
            self.deps
                .segments
                .backend()
                .drain(self.seg, self.job.grant.key),
        )
        .await;
        match drained {
            Ok(Ok(())) => Ok((self.manifest.build(), self.bytes)),
            Ok(Err(e)) => {
                self.deps.segments.forget(addr, self.seg);
                Err(WorkerError::Unavailable(format!(
                    "KV transfer drain failed: {e}"
                )))
            }
            Err(_) => {
                self.deps.segments.forget(addr, self.seg);
                Err(WorkerError::Unavailable(format!(
                    "KV transfer drain not acknowledged within {ACK_TIMEOUT:?}"
                )))
            }
        }
    }

    /// Ends the grant after an abort or a failure elsewhere (a cancel drains: nothing of it
    /// can land afterwards, so decode frees its pages at once).
    pub async fn abort(mut self) {
        self.ended = true;
        let g = &self.job.grant;
        cancel_grant(&self.deps.segments, &g.transfer_addr, self.seg, g.key).await;
    }

    /// Submits the grant pages `batch` (generation-checked bytes: host memory on the CPU,
    /// device to pinned host on a GPU), each from the prefix's pages or the job's own.
    fn submit(
        &mut self,
        pages: Option<&ReadablePages>,
        batch: &[usize],
    ) -> Result<(), WorkerError> {
        let g = &self.job.grant;
        let compute = &self.deps.compute;
        let shared = self.prefix.as_ref().map_or(0, |p| p.table().len());
        let (cached, own): (Vec<usize>, Vec<usize>) = batch
            .iter()
            .map(|&i| i + self.held)
            .partition(|&j| j < shared);
        let own: Vec<usize> = own.into_iter().map(|i| i - shared).collect();
        let mut frames = match &self.prefix {
            Some(p) if !cached.is_empty() => compute.prefix_frames(p, &cached),
            _ => Ok(Vec::new()),
        }
        .map_err(|e| WorkerError::Internal(e.to_string()))?;
        if !own.is_empty() {
            let pages = pages.ok_or_else(|| {
                WorkerError::Internal("the job's own pages were not given to send".into())
            })?;
            frames.extend(
                compute
                    .frames(pages, &own)
                    .map_err(|e| WorkerError::Internal(e.to_string()))?,
            );
        }
        let reqs: Vec<PageWriteReq> = batch
            .iter()
            .zip(frames)
            .map(|(&i, src)| {
                let (page, generation) = g.pages[i];
                PageWriteReq {
                    dst_page: page,
                    dst_generation: generation,
                    tokens: g.tokens_in_page(i) as u32,
                    src,
                }
            })
            .collect();
        self.bytes += reqs.iter().map(|r| r.src.len() as u64).sum::<u64>();
        match self
            .deps
            .segments
            .backend()
            .submit_batch(self.seg, g.key, reqs)
        {
            Ok(h) => {
                self.in_flight.push_back(h);
                Ok(())
            }
            Err(e) => {
                self.ended = true;
                self.deps.segments.forget(&g.transfer_addr, self.seg);
                Err(WorkerError::Unavailable(format!("KV transfer failed: {e}")))
            }
        }
    }

    /// Waits for the oldest batches until at most `keep` are in flight; each confirmed batch
    /// joins the manifest (with the checksums computed when it was sent). On a failure or an
    /// abort the grant is cancelled before the error returns.
    async fn settle(&mut self, keep: usize, cancel: &CancellationToken) -> Result<(), WorkerError> {
        while self.in_flight.len() > keep {
            let Some(mut handle) = self.in_flight.pop_front() else {
                break;
            };
            let status = tokio::select! {
                s = handle.wait_ref() => s,
                () = cancel.cancelled() => BatchStatus::Pending,
            };
            let failure = match status {
                BatchStatus::Completed { .. } => {
                    self.manifest.add_sent(&handle);
                    continue;
                }
                BatchStatus::Pending | BatchStatus::Cancelled { .. } => cancelled(),
                BatchStatus::Failed(f) => {
                    WorkerError::Unavailable(format!("KV transfer failed: {f:?}"))
                }
            };
            self.ended = true;
            let g = &self.job.grant;
            cancel_grant(&self.deps.segments, &g.transfer_addr, self.seg, g.key).await;
            return Err(failure);
        }
        Ok(())
    }
}

impl Drop for GrantWriter<'_> {
    /// A writer dropped before its grant ended (its job's future was dropped mid-way, or a
    /// path returned without ending it): the grant is cancelled in the background, bounded
    /// like every other end, so decode never waits on a writer that is gone.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let segments = self.deps.segments.clone();
        let addr = self.job.grant.transfer_addr.clone();
        let (seg, key) = (self.seg, self.job.grant.key);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move { cancel_grant(&segments, &addr, seg, key).await });
            }
            // No runtime left to cancel on: dropping the connection ends the grant.
            Err(_) => segments.forget(&addr, seg),
        }
    }
}

/// Cancels `key` (which drains it); if decode does not acknowledge in time, drops the
/// connection so the job ends and decode releases the grant's pages as its peer is gone.
async fn cancel_grant(segments: &Segments, addr: &str, seg: SegmentId, key: GrantKey) {
    let acked = tokio::time::timeout(ACK_TIMEOUT, segments.backend().cancel(seg, key)).await;
    match acked {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "KV grant cancel failed: dropping the connection");
            segments.forget(addr, seg);
        }
        Err(_) => {
            tracing::warn!("KV grant cancel not acknowledged in time: dropping the connection");
            segments.forget(addr, seg);
        }
    }
}

/// The segment of `g`'s decode, with `g`'s seal registered on it when its listener seals.
async fn open_grant(deps: &JobDeps, g: &ReceivedGrant) -> Result<SegmentId, WorkerError> {
    let seg = deps
        .segments
        .open(&g.transfer_addr, g.seal.is_some())
        .await?;
    if let Some(seal) = &g.seal {
        deps.segments
            .backend()
            .seal_grant(seg, g.key, seal.clone())
            .map_err(|e| WorkerError::Unavailable(format!("KV transfer failed: {e}")))?;
    }
    Ok(seg)
}
