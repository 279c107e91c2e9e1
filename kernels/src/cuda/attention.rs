//! Launch wrapper for `attention.cu`: paged attention that checks page generations on the GPU.
//!
//! The host hands each sequence's page table as `(page id, generation the owner holds)`; the
//! kernel compares every entry with the pool's current generation before it reads anything and,
//! on a mismatch, leaves that sequence's output untouched and sets its flag. Flags accumulate
//! (OR) in a caller-owned buffer, so one buffer can serve every layer of a step and be read once
//! with [`CudaBackend::read_faults`].

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::context::CudaBackend;
use super::error::{ensure, CudaError, DriverContext};
use super::pool::DeviceKvPool;
use super::source::Module;

/// Threads per block, as `ATT_THREADS` in attention.cu.
const THREADS: u32 = 128;
/// Dynamic shared memory allowed without opting in to more: 48 KiB less the kernel's static
/// shared variables (under 1 KiB).
const SMEM_LIMIT: usize = 47 * 1024;

/// Why the kernel refused a sequence (bits of its flag word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageFault(pub u32);

impl PageFault {
    /// A presented generation is not the page's current one (invariant I1).
    pub fn generation_mismatch(self) -> bool {
        self.0 & 1 != 0
    }
    /// A page id beyond the pool.
    pub fn bad_page(self) -> bool {
        self.0 & 2 != 0
    }
    /// The table has fewer pages than a query position needs.
    pub fn short_table(self) -> bool {
        self.0 & 4 != 0
    }
}

impl std::fmt::Display for PageFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.generation_mismatch() {
            parts.push("page generation mismatch");
        }
        if self.bad_page() {
            parts.push("page id out of range");
        }
        if self.short_table() {
            parts.push("page table shorter than the query position");
        }
        write!(f, "{}", parts.join(", "))
    }
}

/// One attention launch: queries of one or more sequences against their pages of one layer.
#[derive(Clone, Copy, Debug)]
pub struct AttentionBatch<'a> {
    /// Query heads (a multiple of the pool's kv heads).
    pub heads: usize,
    /// Layer whose K/V blocks are read.
    pub layer: usize,
    /// Per sequence: its pages in order, each with the generation the owner presents.
    pub tables: &'a [&'a [(u32, u64)]],
    /// Per query row of `q`: (sequence index into `tables`, position). Row i attends to keys
    /// `0..=position` of its sequence (the last `window` of them with a window).
    pub queries: &'a [(u32, u32)],
    /// Keys a query sees, itself included (a sliding-window layer); `None`: every earlier key.
    pub window: Option<usize>,
    /// The scores' scale; `None`: `1 / sqrt(head_dim)` (a model that scales its queries before
    /// attention asks for 1).
    pub scale: Option<f32>,
}

impl CudaBackend {
    /// Attention for `batch`: `q` and `out` are `[queries][heads][head_dim]` f32; `flags` has
    /// one u32 per sequence (zero it at the start of a step). Arithmetic as
    /// [`crate::attention::paged_attention`].
    pub fn paged_attention(
        &self,
        pool: &DeviceKvPool,
        batch: &AttentionBatch<'_>,
        q: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        flags: &mut CudaSlice<u32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "paged_attention";
        let s = pool.shape;
        let (nq, hd) = (batch.queries.len(), s.head_dim);
        ensure(
            batch.heads > 0 && batch.heads.is_multiple_of(s.kv_heads),
            OP,
            || {
                format!(
                    "{} heads is not a multiple of {} kv heads",
                    batch.heads, s.kv_heads
                )
            },
        )?;
        ensure(hd.is_multiple_of(2) && hd as u32 <= THREADS, OP, || {
            format!("head_dim {hd} must be even and <= {THREADS}")
        })?;
        ensure(batch.layer < s.layers, OP, || {
            format!("layer {} of {}", batch.layer, s.layers)
        })?;
        ensure(
            q.len() >= nq * batch.heads * hd && out.len() >= nq * batch.heads * hd,
            OP,
            || {
                format!(
                    "q {} / out {} floats, {nq} x {} x {hd} needed",
                    q.len(),
                    out.len(),
                    batch.heads
                )
            },
        )?;
        ensure(flags.len() >= batch.tables.len(), OP, || {
            format!("{} flags for {} sequences", flags.len(), batch.tables.len())
        })?;
        if let Some((seq, _)) = batch
            .queries
            .iter()
            .find(|(seq, _)| *seq as usize >= batch.tables.len())
        {
            return Err(CudaError::Shape {
                op: OP,
                why: format!(
                    "query names sequence {seq}, only {} tables",
                    batch.tables.len()
                ),
            });
        }
        if nq == 0 {
            return Ok(());
        }
        let max_pos = batch
            .queries
            .iter()
            .map(|&(_, p)| p as usize)
            .max()
            .unwrap_or(0);
        let keys = batch
            .window
            .map_or(max_pos + 1, |w| w.clamp(1, max_pos + 1));
        let smem = (keys + hd + THREADS as usize) * 4;
        ensure(smem <= SMEM_LIMIT, OP, || {
            format!("position {max_pos} needs {smem} bytes of shared memory (limit {SMEM_LIMIT})")
        })?;

        let mut starts = Vec::with_capacity(batch.tables.len() + 1);
        let (mut ids, mut gens) = (Vec::new(), Vec::new());
        starts.push(0u32);
        for t in batch.tables {
            ids.extend(t.iter().map(|e| e.0));
            gens.extend(t.iter().map(|e| e.1));
            starts.push(ids.len() as u32);
        }
        // Empty tables still need a valid pointer.
        ids.push(0);
        gens.push(0);
        let q_seq: Vec<u32> = batch.queries.iter().map(|q| q.0).collect();
        let q_pos: Vec<u32> = batch.queries.iter().map(|q| q.1).collect();
        let (d_seq, d_pos) = (self.upload(&q_seq)?, self.upload(&q_pos)?);
        let (d_starts, d_ids, d_gens) = (
            self.upload(&starts)?,
            self.upload(&ids)?,
            self.upload(&gens)?,
        );

        let n_pages = pool.pages as u32;
        let (layer, layers, heads) = (batch.layer as u32, s.layers as u32, batch.heads as u32);
        let (kvh, hd32, ps) = (s.kv_heads as u32, hd as u32, s.page_size as u32);
        let scale = batch.scale.unwrap_or(1.0f32 / (hd as f32).sqrt());
        let window = u32::try_from(batch.window.unwrap_or(0)).unwrap_or(u32::MAX);
        let f = self.func(Module::Attention, "paged_attention_f32")?;
        let cfg = LaunchConfig {
            grid_dim: (heads, nq as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(q).arg(out).arg(&pool.data);
        b.arg(&d_seq)
            .arg(&d_pos)
            .arg(&d_starts)
            .arg(&d_ids)
            .arg(&d_gens);
        b.arg(&pool.generations).arg(&n_pages).arg(flags);
        b.arg(&layer)
            .arg(&layers)
            .arg(&heads)
            .arg(&kvh)
            .arg(&hd32)
            .arg(&ps)
            .arg(&scale)
            .arg(&window);
        // SAFETY: shapes checked above; page ids are checked against n_pages in the kernel
        // before any K/V read, and positions against each table's length.
        unsafe { b.launch(cfg) }.during("launching paged attention")?;
        Ok(())
    }

    /// Reads a flags buffer back (waits for the stream): `Some(fault)` for each failed sequence.
    pub fn read_faults(&self, flags: &CudaSlice<u32>) -> Result<Vec<Option<PageFault>>, CudaError> {
        Ok(self
            .download(flags)?
            .into_iter()
            .map(|f| (f != 0).then_some(PageFault(f)))
            .collect())
    }
}
