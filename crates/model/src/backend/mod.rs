//! `Backend`: the ops of the one forward pass (`llama/forward.rs`), which each device
//! implements: the CPU (`backend/cpu.rs`, over `pagewarden_kernels`' CPU kernels, the
//! reference) and the GPU (`cuda/backend.rs`, feature `cuda`). The forward pass and the
//! architectures' blocks (`arch/`) are written once against this trait, so every
//! architecture, the prefix cache and n > 1 run on every backend by construction.
//!
//! - Activations are `rows x width` f32 buffers in the device's memory ([`Backend::Buf`]).
//! - Weights are named by the host's views of them (`QMatrix`, `&[f32]`, borrowed from the
//!   model); a device backend maps each to the copy it uploaded at load.
//! - KV pages are kvcache's: a sequence's table of `(PageId, Generation)` names them, the
//!   backend writes and reads their data, and every read is checked against the page's
//!   current generation (I1) before any of its data is used.
//!
//! A failure of an op is the device's (the whole pass is lost, [`Backend::Error`]); what fails
//! one sequence (a generation mismatch, a short table) is that sequence's error, set on its
//! [`SeqWork`] by [`Backend::attention`] or [`Backend::finish`].

pub(crate) mod cpu;

use pagewarden_kernels::rope::Rope;
use pagewarden_kernels::{AttnGeometry, QMatrix};

use crate::llama::forward::{Pass, SeqWork};

/// The gated activation of an FFN (`gate = act(gate) * up`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Glu {
    /// SiLU (SwiGLU: Llama-style blocks).
    Silu,
    /// tanh-approximated GELU (GeGLU: Gemma 3).
    Gelu,
}

/// The ops one forward pass runs, on one device. Every op is ordered after the ones called
/// before it (a device backend queues them on one stream).
pub(crate) trait Backend: Sized {
    /// `rows x width` f32 activations, row-major, in the device's memory.
    type Buf;
    /// A device failure: the whole pass is lost.
    type Error: std::fmt::Display;
    /// What one pass keeps beside its activations (the GPU's per-sequence fault flags).
    type Step;

    /// Floats in `x`.
    fn len(x: &Self::Buf) -> usize;
    /// A buffer of `len` zeros.
    fn zeros(&self, len: usize) -> Result<Self::Buf, Self::Error>;
    /// Starts a pass over `seqs` (those that are live after admission).
    fn begin(&self, seqs: &[SeqWork<'_>]) -> Result<Self::Step, Self::Error>;
    /// Row `row` of `out` = the embedding of `token` times `scale`, for each `(row, token)`.
    fn embed(
        &self,
        table: &QMatrix<'_>,
        rows: &[(usize, u32)],
        scale: Option<f32>,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;
    /// RMSNorm of each `w.len()`-wide row of `x` into `out` (also per head, with a
    /// `head_dim`-wide `w`).
    fn rms_norm(
        &self,
        x: &Self::Buf,
        w: &[f32],
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;
    /// `outs[i] = ws[i] · x` for `rows` rows of `x`, which is quantized once for all of them.
    fn matmul_many(
        &self,
        ws: &[QMatrix<'_>],
        x: &Self::Buf,
        rows: usize,
        outs: &mut [&mut Self::Buf],
    ) -> Result<(), Self::Error>;
    /// `x[r] += bias` for every `bias.len()`-wide row `r`.
    fn add_rows(&self, x: &mut Self::Buf, bias: &[f32]) -> Result<(), Self::Error>;
    /// `x += y`, elementwise (a residual connection).
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf) -> Result<(), Self::Error>;
    /// `x *= s`, elementwise.
    fn scale(&self, x: &mut Self::Buf, s: f32) -> Result<(), Self::Error>;
    /// `x = tanh(x / cap) * cap`, elementwise (logit soft-capping).
    fn softcap(&self, x: &mut Self::Buf, cap: f32) -> Result<(), Self::Error>;
    /// Rotates row `r` of `q` and of `k` by `table[r]` (cos, sin per pair), NeoX pairs if
    /// `neox`.
    fn rope(
        &self,
        rope: &Rope,
        table: &[Vec<(f32, f32)>],
        neox: bool,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
    ) -> Result<(), Self::Error>;
    /// `gate = act(gate) * up`, elementwise.
    fn glu(&self, act: Glu, gate: &mut Self::Buf, up: &Self::Buf) -> Result<(), Self::Error>;
    /// Keeps rows `rows` (ascending) of the `width`-wide rows of `x`, in order, and drops the
    /// rest.
    fn keep_rows(&self, x: &mut Self::Buf, width: usize, rows: &[usize])
        -> Result<(), Self::Error>;
    /// Drops every float of `x` after the first `len`.
    fn truncate(&self, x: &mut Self::Buf, len: usize) -> Result<(), Self::Error>;
    /// Layer `layer`'s attention: each live sequence's K/V rows (`p.k`, `p.v`) written into
    /// its pages, then its queries (`p.q`) attending over its pages into `p.att`, with `geo`.
    /// A sequence whose pages are refused gets its error and no output.
    fn attention(
        &self,
        step: &mut Self::Step,
        layer: usize,
        geo: &AttnGeometry,
        seqs: &mut [SeqWork<'_>],
        p: &mut Pass<Self>,
    ) -> Result<(), Self::Error>;
    /// Ends the pass: refusals found on the device become the sequences' errors.
    fn finish(&self, step: Self::Step, seqs: &mut [SeqWork<'_>]) -> Result<(), Self::Error>;
    /// `x` on the host (the CPU's buffer itself, no copy).
    fn to_host(&self, x: Self::Buf) -> Result<Vec<f32>, Self::Error>;
}
