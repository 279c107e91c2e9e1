//! Matrix products `out[t][r] = sum_c w[r][c] * x[t][c]` for quantized or float weights.
//!
//! Quantized weights take the llama.cpp route: the activations are quantized to 8 bits per
//! 32-block and the dot products run in integers (`act`). Work is split over output rows; inside
//! one chunk of rows the activations are walked in tiles of tokens so each weight block is
//! unpacked once per tile (prefill reuses the weights across tokens).

mod avx2;
mod avx512;
pub mod bf16;
mod dest;
#[cfg(target_arch = "x86_64")]
mod kquant_avx2;
#[cfg(target_arch = "x86_64")]
mod kquant_avx512;
pub mod kquant_portable;
pub mod kquant_tiled;
pub mod packed;
#[cfg(target_arch = "x86_64")]
mod packed_avx2;
mod packed_k;
#[cfg(target_arch = "x86_64")]
mod packed_k_avx2;
pub mod portable;
pub mod q4k_repacked;

use crate::act::{quantize_acts_with, QuantizedActs};
use crate::act_k::{quantize_acts_k_with, QuantizedActsK};
use crate::isa::Isa;
use crate::parallel::Parallel;
use crate::quant::{ActKind, WeightType};
use dest::Dest;
use packed::PackedRows;

/// Which of llama.cpp's float orders a K-quant product takes for one activation row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KOrder {
    /// `ggml_vec_dot_*_q8_K` (`kquant_portable`).
    VecDot,
    /// A repacked Q4_K matrix's `gemm` or `gemv` (`q4k_repacked`).
    Repacked(q4k_repacked::Route),
    /// The tiled kernel of 8 or more rows (`kquant_tiled`).
    Tiled,
}

impl KOrder {
    /// The order of row `t` of a `tokens`-row product with `w` (any type; only K-quants read it).
    pub(crate) fn of(w: &QMatrix<'_>, t: usize, tokens: usize) -> KOrder {
        if q4k_repacked::applies(w) {
            KOrder::Repacked(q4k_repacked::Route::of(t, tokens))
        } else if kquant_tiled::applies(w, tokens) {
            KOrder::Tiled
        } else {
            KOrder::VecDot
        }
    }
}

/// A borrowed row-major weight matrix in one of the supported storage types.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    /// Storage type.
    pub ty: WeightType,
    /// Output rows.
    pub rows: usize,
    /// Elements per row (the contiguous dimension).
    pub cols: usize,
    /// `rows * ty.row_bytes(cols)` bytes.
    pub data: &'a [u8],
    /// The same rows interleaved for the 512-bit kernels, when the loader packed them
    /// ([`QMatrix::with_packed`]); other instruction sets read `data`.
    pub packed: Option<&'a PackedRows>,
}

impl<'a> QMatrix<'a> {
    /// Wraps `data`, checking its length against the shape.
    pub fn new(ty: WeightType, rows: usize, cols: usize, data: &'a [u8]) -> Option<QMatrix<'a>> {
        let need = ty.row_bytes(cols)?.checked_mul(rows)?;
        (data.len() == need).then_some(QMatrix {
            ty,
            rows,
            cols,
            data,
            packed: None,
        })
    }

    /// This matrix with its interleaved packing (`PackedRows::pack` of the same matrix).
    pub fn with_packed(self, packed: &'a PackedRows) -> QMatrix<'a> {
        assert!(packed.packs(&self), "packing of another matrix");
        QMatrix {
            packed: Some(packed),
            ..self
        }
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.ty
            .row_bytes(self.cols)
            .expect("checked at construction")
    }

    /// The bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// The activations in the form the weight type's dot product wants.
pub(crate) enum Acts<'a> {
    /// For F32/F16/BF16 weights: plain floats, `tokens * cols`.
    Float(&'a [f32]),
    /// For Q4_0, Q4_1, Q5_0, Q8_0 weights: 8 bits per 32 elements.
    Quant(&'a QuantizedActs),
    /// For K-quant weights: 8 bits per 256 elements (Q8_K).
    QuantK(&'a QuantizedActsK),
}

/// `out[t * w.rows + r] = dot(w.row(r), x[t * w.cols..])` for `t < tokens`, with the best ISA.
pub fn matmul(w: &QMatrix<'_>, x: &[f32], tokens: usize, out: &mut [f32], par: &Parallel) {
    matmul_with(Isa::detect(), w, x, tokens, out, par)
}

/// [`matmul`] with an explicit instruction set (tests compare every ISA with `Portable`).
pub fn matmul_with(
    isa: Isa,
    w: &QMatrix<'_>,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
    par: &Parallel,
) {
    matmul_many_with(isa, &[*w], x, tokens, &mut [out], par)
}

/// Several products of the same activations (Q/K/V, gate/up): `outs[i] = ws[i] x`, each as
/// [`matmul`]. The activations are quantized once and all rows run in one parallel pass.
pub fn matmul_many(
    ws: &[QMatrix<'_>],
    x: &[f32],
    tokens: usize,
    outs: &mut [&mut [f32]],
    par: &Parallel,
) {
    matmul_many_with(Isa::detect(), ws, x, tokens, outs, par)
}

/// A pointer to one output matrix, shared by the tasks that fill disjoint rows of it.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (each owns a range of weight rows) and the slices
// outlive the parallel pass.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`.
unsafe impl Sync for OutPtr {}

/// [`matmul_many`] with an explicit instruction set.
pub fn matmul_many_with(
    isa: Isa,
    ws: &[QMatrix<'_>],
    x: &[f32],
    tokens: usize,
    outs: &mut [&mut [f32]],
    par: &Parallel,
) {
    assert_eq!(ws.len(), outs.len(), "one output per weight");
    let Some(cols) = ws.first().map(|w| w.cols) else {
        return;
    };
    assert_eq!(x.len(), tokens * cols, "activation shape");
    for (w, o) in ws.iter().zip(outs.iter()) {
        assert_eq!(w.cols, cols, "weights share the activations");
        assert_eq!(o.len(), tokens * w.rows, "output shape");
    }
    if tokens == 0 {
        return;
    }
    // Each activation format the weights need, prepared once for all of them.
    let needs = |k: ActKind| ws.iter().any(|w| w.ty.act_kind() == k);
    let quant = needs(ActKind::Q8).then(|| {
        let mut q = quantize_acts_with(isa, x, tokens, cols, par);
        if isa == Isa::Avx512 {
            for offset in ws.iter().filter_map(avx512::lane_offset) {
                q.add_lane_starts(offset);
            }
        }
        q
    });
    let quant_k = needs(ActKind::Q8K).then(|| quantize_acts_k_with(isa, x, tokens, cols, par));
    let total: usize = ws.iter().map(|w| w.rows).sum();
    // About eight jobs per thread, so the last ones even out the threads (an uneven split of
    // wo or ffn_down into nine jobs left one thread idle a tenth of the time), in whole
    // groups of four rows for the decode kernel (sixteen for the interleaved one).
    let align = if isa != Isa::Portable && ws.iter().any(|w| w.packed.is_some()) {
        packed::GROUP
    } else {
        4
    };
    // A job of one token is short, and every job costs a claim on a line the threads share:
    // the output head (49,152 rows) took 768 of them a step with 64-row jobs.
    let most = if tokens == 1 { 256 } else { 64 };
    let chunk_rows = (total / (par.threads() * 8)).clamp(2 * align, most) / align * align;
    let mut jobs = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        jobs.extend(
            (0..w.rows)
                .step_by(chunk_rows)
                .map(|r0| (i, r0, chunk_rows.min(w.rows - r0))),
        );
    }
    let ptrs: Vec<OutPtr> = outs.iter_mut().map(|o| OutPtr(o.as_mut_ptr())).collect();
    par.for_each_index(jobs.len(), |j| {
        let (i, r0, n) = jobs[j];
        let w = &ws[i];
        let acts = match w.ty.act_kind() {
            ActKind::Float => Acts::Float(x),
            ActKind::Q8 => Acts::Quant(quant.as_ref().expect("quantized above")),
            ActKind::Q8K => Acts::QuantK(quant_k.as_ref().expect("quantized above")),
        };
        let out = ptrs[i].0;
        if tokens == 1 {
            // SAFETY: rows r0..r0+n of a one-token output belong to this task alone.
            let o = unsafe { std::slice::from_raw_parts_mut(out.add(r0), n) };
            rows_kernel(isa, w, r0, n, &acts, 1, o);
            return;
        }
        // Whole packed groups go straight into the token-major output, a run of consecutive
        // rows per token.
        // SAFETY: the output holds `tokens * w.rows` elements (checked above) and outlives
        // the pass; only this task touches rows r0..r0+n.
        let direct = unsafe { Dest::by_token(out, tokens * w.rows, r0, w.rows) };
        let done = packed_rows(isa, w, r0, n, &acts, tokens, direct);
        let (r0, n) = (r0 + done, n - done);
        if n == 0 {
            return;
        }
        // The other kernels fill `n x tokens` (by weight row); scatter it into token-major
        // rows. The buffer is the thread's own, kept from job to job (no allocation per job).
        SCRATCH.with_borrow_mut(|buf| {
            // Every element is written by the kernel (zeroing a 512-token job's 128 KiB was a
            // memset per job).
            let buf = crate::scratch::prefix(buf, n * tokens);
            rows_kernel(isa, w, r0, n, &acts, tokens, buf);
            for t in 0..tokens {
                for (r, v) in buf.iter().skip(t).step_by(tokens).enumerate() {
                    // SAFETY: element (t, r0 + r) is inside the checked output and only this
                    // task writes rows r0..r0+n.
                    unsafe { *out.add(t * w.rows + r0 + r) = *v };
                }
            }
        });
    });
}

thread_local! {
    /// A job's `rows x tokens` results before they are scattered (see `matmul_many_with`).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows `r0..r0 + n` of `w`'s whole packed groups for all tokens into `out`, with the kernels
/// that compute a group's rows of one token at once; returns how many rows it did (none
/// unless `w` is packed for this ISA and `r0` starts a group).
fn packed_rows(
    isa: Isa,
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    acts: &Acts<'_>,
    tokens: usize,
    out: Dest<'_>,
) -> usize {
    match isa {
        Isa::Portable => 0,
        Isa::Avx2 => avx2::packed_rows(false, w, r0, n, acts, tokens, out),
        Isa::Avx512 => avx512::packed_rows(w, r0, n, acts, tokens, out),
    }
}

/// Computes rows `r0..r0+n` for all tokens into `out[(r - r0) * tokens + t]`.
fn rows_kernel(
    isa: Isa,
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    acts: &Acts<'_>,
    tokens: usize,
    out: &mut [f32],
) {
    if w.ty == WeightType::BF16 {
        return bf16::rows(isa, w, r0, n, acts, tokens, out);
    }
    match isa {
        Isa::Portable => portable::rows(w, r0, n, acts, tokens, out),
        Isa::Avx2 => avx2::rows(false, w, r0, n, acts, tokens, out),
        Isa::Avx512 => avx512::rows(w, r0, n, acts, tokens, out),
    }
}
