//! One process, the real pieces: router-style admission, a decode `KvPool` that reserves and
//! grants, a prefill `KvPool` that computes synthetic marker KV, the memory transfer backend
//! (real frames, real receiver session, the decode pool as its `PageSink`), decode commit and
//! generation-checked reads. Detections are recorded as `IntegrityEvent`s.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use pagewarden_common::admission::{Admission, Rejection};
use pagewarden_common::integrity::{IntegrityEvent, IntegrityKind};
use pagewarden_kvcache::{
    f16, page_checksum, CommitError, CommitManifest, KvLayout, KvPool, Owner, PoolConfig,
    PoolStats, ReadError, ReadablePages, RequestId, ReserveError, TenantId,
};
use pagewarden_transfer::{
    BatchStatus, EngineConfig, MemoryBackend, PageSink, PageWriteReq, SegmentId, TransferBackend,
};

use super::layers::Layers;
use super::markers::{marker_bytes, Tenant};

/// Page shape: 2 layers, 1 KV head of 8, 16 tokens a page (1 KiB pages).
pub const LAYOUT: KvLayout = KvLayout {
    layers: 2,
    kv_heads: 1,
    head_dim: 8,
    page_size: 16,
};
/// The context every worker advertises.
pub const ADVERTISED_CONTEXT: usize = 512;
/// Decode pool pages (1,024 tokens: holds the advertised context).
pub const DECODE_PAGES: usize = 64;
/// Prefill pool pages (128 tokens: smaller than the advertised context).
pub const PREFILL_PAGES: usize = 8;

/// Why a request failed. Never carries KV bytes.
#[derive(Debug)]
pub enum Failure {
    /// Admission refused it (`by` = "router", "decode" or "prefill"); HTTP 400.
    Rejected {
        /// Which component refused.
        by: &'static str,
        /// Why.
        reason: Rejection,
    },
    /// A pool had no room.
    Reserve(ReserveError),
    /// The transfer failed.
    Transfer(String),
    /// Decode refused the commit.
    Commit(CommitError),
    /// A KV read was refused.
    Read(ReadError),
}

/// What a client got back: the KV bytes decode attended over (the "response").
#[derive(Debug)]
pub struct Response {
    /// Concatenated bytes of every page read.
    pub bytes: Vec<u8>,
}

/// The in-process cluster.
pub struct Cluster {
    /// Which defenses run.
    pub layers: Layers,
    /// The decode worker's pool.
    pub decode: Arc<KvPool>,
    /// The prefill worker's pool.
    pub prefill: Arc<KvPool>,
    backend: MemoryBackend,
    seg: SegmentId,
    events: Mutex<Vec<IntegrityEvent>>,
}

fn pool(pages: usize, layers: &Layers) -> Arc<KvPool> {
    let mut cfg = PoolConfig::with_pages(LAYOUT, pages);
    cfg.defenses = layers.pool;
    Arc::new(KvPool::new(cfg))
}

fn owner(t: &Tenant) -> Owner {
    Owner {
        request: RequestId::random(),
        tenant: TenantId::new(t.name),
    }
}

impl Cluster {
    /// A decode pool of [`DECODE_PAGES`], a prefill pool of [`PREFILL_PAGES`], connected by
    /// the memory backend.
    pub async fn new(layers: Layers) -> Self {
        Self::with_pages(layers, DECODE_PAGES, PREFILL_PAGES).await
    }

    /// A cluster with pools of the given sizes.
    pub async fn with_pages(layers: Layers, decode_pages: usize, prefill_pages: usize) -> Self {
        let decode = pool(decode_pages, &layers);
        let prefill = pool(prefill_pages, &layers);
        let backend = MemoryBackend::new(EngineConfig::default());
        let sink: Arc<dyn PageSink> = decode.clone();
        let desc = backend.register_segment(sink).await.expect("register");
        let seg = backend.open_segment(&desc).await.expect("open");
        Self {
            layers,
            decode,
            prefill,
            backend,
            seg,
            events: Mutex::new(Vec::new()),
        }
    }

    /// Both pools' page-state counts.
    pub fn stats(&self) -> (PoolStats, PoolStats) {
        (self.decode.stats(), self.prefill.stats())
    }

    /// The transfer backend and the decode segment it has open.
    pub fn transfer(&self) -> (&MemoryBackend, SegmentId) {
        (&self.backend, self.seg)
    }

    /// Integrity events recorded so far.
    pub fn events(&self) -> Vec<IntegrityEvent> {
        self.events.lock().expect("events").clone()
    }

    fn report(&self, role: &'static str, kind: IntegrityKind, o: Option<&Owner>, d: String) {
        self.events.lock().expect("events").push(IntegrityEvent {
            node_id: format!("harness-{role}"),
            role,
            kind,
            request: o.map(|o| o.request),
            tenant: o.map(|o| o.tenant.clone()),
            page: None,
            detail: d,
        });
    }

    /// Prefill's forward pass, synthetic: allocates `tokens` in the prefill pool and fills
    /// every slot of every page with `t`'s marker bytes.
    pub fn prefill_compute(&self, t: &Tenant, tokens: usize) -> Result<ReadablePages, Failure> {
        let mut seq = self
            .prefill
            .allocate(owner(t), tokens)
            .map_err(Failure::Reserve)?;
        let page = marker_bytes(t.marker, LAYOUT.page_bytes());
        let tw = LAYOUT.token_width();
        for pos in 0..seq.capacity() {
            let slot = pos % LAYOUT.page_size;
            for layer in 0..LAYOUT.layers {
                let (k, v) = seq.kv_row_mut(layer, pos).map_err(Failure::Read)?;
                for (kind, row) in [(0, k), (1, v)] {
                    let off = (LAYOUT.block_offset(layer, kind) + slot * tw) * 2;
                    for (e, x) in row.iter_mut().enumerate() {
                        let b = [page[off + 2 * e], page[off + 2 * e + 1]];
                        *x = f16::from_bits(u16::from_le_bytes(b));
                    }
                }
            }
        }
        seq.set_len(tokens);
        Ok(seq)
    }

    /// Router admission (when on) against the cluster's effective context.
    fn router_admit(&self, prompt: usize, max_tokens: usize) -> Result<(), Failure> {
        if !self.layers.router_rejection {
            return Ok(());
        }
        let pool_tokens = self
            .prefill
            .capacity_tokens()
            .min(self.decode.capacity_tokens());
        Admission::new(ADVERTISED_CONTEXT, pool_tokens)
            .check(prompt, max_tokens)
            .map(|_| ())
            .map_err(|reason| Failure::Rejected {
                by: "router",
                reason,
            })
    }

    fn worker_admit(
        &self,
        by: &'static str,
        pool: &KvPool,
        prompt: usize,
        max_tokens: usize,
    ) -> Result<(), Failure> {
        if !self.layers.worker_admission {
            return Ok(());
        }
        Admission::new(ADVERTISED_CONTEXT, pool.capacity_tokens())
            .check(prompt, max_tokens)
            .map(|_| ())
            .map_err(|reason| Failure::Rejected { by, reason })
    }

    /// One request end to end. (The incident, an over-length prompt through every defense, is
    /// replayed on the real services: `tests/tests/incident_real_services.rs`.)
    pub async fn serve(
        &self,
        t: &Tenant,
        prompt: usize,
        max_tokens: usize,
    ) -> Result<Response, Failure> {
        self.router_admit(prompt, max_tokens)?;
        self.worker_admit("decode", &self.decode, prompt, max_tokens)?;
        let o = owner(t);
        let reserved = self
            .decode
            .reserve(o.clone(), prompt)
            .map_err(Failure::Reserve)?;
        let grant = reserved.grant().clone();
        if let Err(e) = self.worker_admit("prefill", &self.prefill, prompt, max_tokens) {
            reserved.abort();
            let _ = self.backend.cancel(self.seg, grant.key).await;
            return Err(e);
        }
        let seq = self.prefill_compute(t, prompt)?;
        let mut reqs = Vec::with_capacity(grant.pages.len());
        let mut sums = Vec::with_capacity(grant.pages.len());
        for (i, &(page, generation)) in grant.pages.iter().enumerate() {
            let tokens = grant.tokens_in_page(i);
            let src = seq.page_bytes(i).map_err(Failure::Read)?.to_vec();
            sums.push(page_checksum(&src));
            reqs.push(PageWriteReq {
                dst_page: page,
                dst_generation: generation,
                tokens: tokens as u32,
                src: Bytes::from(src),
            });
        }
        drop(seq);
        let batch = self
            .backend
            .submit_batch(self.seg, grant.key, reqs)
            .map_err(|e| Failure::Transfer(e.to_string()))?;
        let status = batch.wait().await;
        if !matches!(status, BatchStatus::Completed { .. }) {
            reserved.abort();
            let _ = self.backend.cancel(self.seg, grant.key).await;
            return Err(Failure::Transfer(format!("{status:?}")));
        }
        self.backend
            .drain(self.seg, grant.key)
            .await
            .map_err(|e| Failure::Transfer(e.to_string()))?;
        let manifest = CommitManifest::new(grant.key, prompt, sums);
        let readable = match reserved.commit(&manifest) {
            Ok(r) => r,
            Err(e) => {
                let kind = match &e {
                    CommitError::TokenCountMismatch { .. } => IntegrityKind::CountMismatch,
                    CommitError::ChecksumMismatch(_) => IntegrityKind::ChecksumMismatch,
                    CommitError::PageNotWritten(_) => IntegrityKind::PageNotWritten,
                    CommitError::GuardWordCorrupt(_) => IntegrityKind::GuardWordCorrupt,
                    CommitError::KeyMismatch
                    | CommitError::DigestMismatch
                    | CommitError::Expired => IntegrityKind::ManifestMismatch,
                };
                self.report("decode", kind, Some(&o), e.to_string());
                self.decode.mark_drained(grant.key);
                return Err(Failure::Commit(e));
            }
        };
        let mut bytes = Vec::with_capacity(readable.table().len() * LAYOUT.page_bytes());
        for i in 0..readable.table().len() {
            match readable.page_bytes(i) {
                Ok(b) => bytes.extend_from_slice(b),
                Err(e) => {
                    self.report(
                        "decode",
                        IntegrityKind::GenerationMismatch,
                        Some(&o),
                        e.to_string(),
                    );
                    return Err(Failure::Read(e));
                }
            }
        }
        Ok(Response { bytes })
    }
}
