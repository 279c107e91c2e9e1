//! Attention with llama.cpp's CPU flash-attention arithmetic (`-fa on`, f16 cache), for
//! bit-parity with a llama.cpp run that used it (llama-server turns it on by default on CPU).
//! [`crate::attention`] follows llama.cpp with flash attention off, and stays the default.
//!
//! Per query token and head, over the keys it sees in order (ggml's
//! `flash_attn_ext_f16_one_chunk`, as built for a CPU with AVX-512 FP16):
//! - q is rounded to f16; each score is the f16 dot product of q and the key, accumulated in
//!   f32 over four 16-lane accumulators and reduced as ggml reduces them, then scaled;
//! - an online softmax with libm's `exp`: a new maximum rescales the accumulator, otherwise
//!   the key's weight is `exp(s - max)`;
//! - the weighted values are accumulated **in f16** (`fma` in half precision with the weight
//!   rounded to f16, or, for heads narrower than 128, in f32 rounded to f16 per element), and
//!   the result is the accumulator times `1 / sum`.
//!
//! Every f16 step is emulated exactly: a product of two f16 values is exact in f32, and the
//! fused sums are rounded once through f64.
//!
//! It is a reference path, run only when asked for (`LoadOptions::flash_attention`): one
//! query row and head at a time, split over the pool by (token, head).

use half::f16;

use crate::attention::{AttnGeometry, KvBlock};
use crate::expf::reduce16;
use crate::parallel::Parallel;

/// ggml's f16 vector step on AVX-512 FP16: heads whose width is a multiple of this take the
/// half-precision vector path, the rest its scalar leftovers.
const F16_STEP: usize = 128;

/// Attention for `n` query tokens as llama.cpp computes it with flash attention on: `q` and
/// `out` are `n * heads * head_dim`, each score is multiplied by `scale` (llama.cpp's
/// `kq_scale`: `1/sqrt(head_dim)` for Llama, `1` for Gemma 3, whose queries are scaled
/// before).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention(
    geo: &AttnGeometry,
    q: &[f32],
    n: usize,
    first_pos: usize,
    blocks: &[KvBlock<'_>],
    out: &mut [f32],
    scale: f32,
    par: &Parallel,
) {
    geo.check_call(q, n, first_pos, blocks, out);
    let (hd, heads) = (geo.head_dim, geo.heads);
    let qw = heads * hd;
    let tw = geo.token_width();
    let group = heads / geo.kv_heads;
    let row = |key: usize, kvh: usize| {
        let b = &blocks[key / geo.page_size];
        let at = (key % geo.page_size) * tw + kvh * hd;
        (&b.k[at..at + hd], &b.v[at..at + hd])
    };
    let outp = OutPtr(out.as_mut_ptr());
    par.for_each_index(n * heads, |item| {
        let outp = &outp;
        let (i, h) = (item / heads, item % heads);
        let keys = first_pos + i + 1;
        let first = geo.first_key(keys);
        let kvh = h / group;
        let qh: Vec<f16> = q[i * qw + h * hd..][..hd]
            .iter()
            .map(|&x| f16::from_f32(x))
            .collect();
        let mut acc = vec![f16::ZERO; hd];
        let (mut sum, mut max) = (0f32, f32::NEG_INFINITY);
        for key in first..keys {
            let (k, v) = row(key, kvh);
            let s = dot_f16(k, &qh) * scale;
            let (ms, vs) = if s > max {
                let old = max;
                max = s;
                let ms = (old - max).exp();
                scale_f16(&mut acc, ms);
                (ms, 1.0)
            } else {
                (1.0, (s - max).exp())
            };
            mad_f16(&mut acc, v, vs);
            // `S = S*ms + vs`, which GCC contracts to one fused multiply-add.
            sum = sum.mul_add(ms, vs);
        }
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        // SAFETY: item (i, h) alone writes this head's row of `out`, which outlives the region.
        let o = unsafe { std::slice::from_raw_parts_mut(outp.0.add(i * qw + h * hd), hd) };
        for (o, a) in o.iter_mut().zip(&acc) {
            *o = a.to_f32() * inv;
        }
    });
}

/// The output, written at disjoint rows by the items of one region.
struct OutPtr(*mut f32);
// SAFETY: see `flash_attention`.
unsafe impl Sync for OutPtr {}

/// ggml's `ggml_vec_dot_f16` with f32 accumulation: four 16-lane accumulators over 64-element
/// steps, added pairwise, then one register's lanes in GCC's order; the rest one by one in
/// f64.
fn dot_f16(x: &[f16], y: &[f16]) -> f32 {
    const STEP: usize = 64;
    let np = x.len() / STEP * STEP;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(STEP) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                let at = i + j * 16 + l;
                *lane = x[at].to_f32().mul_add(y[at].to_f32(), *lane);
            }
        }
    }
    let mut sum = 0f64;
    if np > 0 {
        let mut r = [0f32; 16];
        for l in 0..16 {
            r[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
        }
        sum = reduce16(&r) as f64;
    }
    for i in np..x.len() {
        sum += (x[i].to_f32() * y[i].to_f32()) as f64;
    }
    sum as f32
}

/// `y *= v` (ggml's `ggml_vec_scale_f16`): in half precision with `v` rounded to f16 over whole
/// steps, in f32 rounded to f16 for the rest.
fn scale_f16(y: &mut [f16], v: f32) {
    let np = y.len() / F16_STEP * F16_STEP;
    let vh = f16::from_f32(v).to_f32();
    for a in &mut y[..np] {
        // Two f16 values: the product is exact in f32, rounded once to f16.
        *a = f16::from_f32(a.to_f32() * vh);
    }
    for a in &mut y[np..] {
        *a = f16::from_f32(a.to_f32() * v);
    }
}

/// `y += x * v` (ggml's `ggml_vec_mad_f16`): a half-precision fused multiply-add with `v`
/// rounded to f16 over whole steps, a single-precision one rounded to f16 for the rest.
fn mad_f16(y: &mut [f16], x: &[f16], v: f32) {
    let np = y.len() / F16_STEP * F16_STEP;
    let vh = f16::from_f32(v).to_f32();
    for (a, b) in y[..np].iter_mut().zip(&x[..np]) {
        // x * vh is exact in f32 (two 11-bit significands); the sum is rounded once, to f16.
        let exact = (b.to_f32() * vh) as f64 + a.to_f32() as f64;
        *a = f16::from_f64(exact);
    }
    for (a, b) in y[np..].iter_mut().zip(&x[np..]) {
        *a = f16::from_f32(b.to_f32().mul_add(v, a.to_f32()));
    }
}
