//! Elementwise activations and softmax, rounded like ggml's CPU backend: `exp` is ggml's
//! vectorized one (`expf`) on whole 16-element blocks and libm's on a shorter tail, and the
//! softmax sums each block's exponentials in 16-lane order before adding them up in f64.

use half::f16;

use crate::expf::{expf, reduce16};
use crate::isa::Isa;

/// ggml's vector width on the reference machine (AVX-512: 16 f32 lanes).
pub(crate) const LANES: usize = 16;

/// SiLU: `x * sigmoid(x)`, computed as `x / (1 + e^-x)` with ggml's vectorized `exp`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(0.0 - x))
}

/// SiLU with libm's `exp` (ggml's scalar tail).
#[inline]
fn silu_libm(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation, in f32 as ggml's `ggml_gelu_f32` (libm `tanh`).
fn gelu_f32(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    // `1 + a*x*x` as GCC compiles ggml: one fused multiply-add.
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// ggml's GELU table: for every f16 bit pattern, `gelu` of that value rounded to f16 (the
/// CUDA backend uploads it, so both compute [`geglu`]'s bits).
pub fn gelu_table() -> &'static [f16; 1 << 16] {
    static TABLE: std::sync::OnceLock<Box<[f16; 1 << 16]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([f16::ZERO; 1 << 16]);
        for (i, v) in t.iter_mut().enumerate() {
            *v = f16::from_f32(gelu_f32(f16::from_bits(i as u16).to_f32()));
        }
        t
    })
}

/// [`gelu_table`] widened to f32, for the vector kernels' gathers (256 KiB).
fn gelu_table_f32() -> &'static [f32; 1 << 16] {
    static TABLE: std::sync::OnceLock<Box<[f32; 1 << 16]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0f32; 1 << 16]);
        for (v, h) in t.iter_mut().zip(gelu_table().iter()) {
            *v = h.to_f32();
        }
        t
    })
}

/// GeGLU in place: `gate[i] = gelu(gate[i]) * up[i]`, rounded as ggml's CPU backend does
/// (`GGML_GELU_FP16`): zero below -10, identity above 10, otherwise the f16 table looked up
/// at the f16 rounding of the input.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    geglu_with(Isa::detect(), gate, up)
}

/// [`geglu`] on an explicit instruction set: the same bits on every one (the vector kernels
/// round to f16 with F16C, to nearest even as `half` does, and gather the same table's
/// values), but for the payload of a NaN.
pub fn geglu_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "geglu: shape");
    let body = gate.len() / LANES * LANES;
    let (g, u) = (&mut gate[..body], &up[..body]);
    match isa {
        Isa::Portable => geglu_scalar(g, u),
        // SAFETY: Avx2 is only detected when the CPU has avx2, fma and f16c.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { geglu_avx2(g, u) },
        // SAFETY: Avx512 is only detected when the CPU has avx512f, avx2, fma and f16c.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { geglu_avx512(g, u) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => geglu_scalar(g, u),
    }
    geglu_scalar(&mut gate[body..], &up[body..]);
}

fn geglu_scalar(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[f16::from_f32(x).to_bits() as usize].to_f32() * u
        };
    }
}

/// [`geglu_scalar`] sixteen lanes at a time: the f16 bits from `vcvtps2ph`, the table's value
/// gathered, the two ends masked in.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn geglu_avx512(gate: &mut [f32], up: &[f32]) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`); every gathered
    // index is a u16, inside the 65,536-entry table.
    unsafe {
        use std::arch::x86_64::*;
        debug_assert_eq!(gate.len() % LANES, 0);
        let table = gelu_table_f32().as_ptr();
        let (lo, hi) = (_mm512_set1_ps(-10.0), _mm512_set1_ps(10.0));
        for (g, u) in gate.chunks_exact_mut(LANES).zip(up.chunks_exact(LANES)) {
            let x = _mm512_loadu_ps(g.as_ptr());
            let u = _mm512_loadu_ps(u.as_ptr());
            let bits = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            let t = _mm512_i32gather_ps::<4>(_mm512_cvtepu16_epi32(bits), table);
            let big = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, hi);
            let kept = !_mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, lo);
            let r = _mm512_mask_mov_ps(_mm512_mul_ps(t, u), big, _mm512_mul_ps(x, u));
            _mm512_storeu_ps(g.as_mut_ptr(), _mm512_maskz_mov_ps(kept, r));
        }
    }
}

/// [`geglu_avx512`] eight lanes at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn geglu_avx2(gate: &mut [f32], up: &[f32]) {
    // SAFETY: as in `geglu_avx512`.
    unsafe {
        use std::arch::x86_64::*;
        let table = gelu_table_f32().as_ptr();
        let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
        for (g, u) in gate.chunks_exact_mut(8).zip(up.chunks_exact(8)) {
            let x = _mm256_loadu_ps(g.as_ptr());
            let u = _mm256_loadu_ps(u.as_ptr());
            let bits = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            let t = _mm256_i32gather_ps::<4>(table, _mm256_cvtepu16_epi32(bits));
            let big = _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi);
            let low = _mm256_cmp_ps::<_CMP_LE_OQ>(x, lo);
            let r = _mm256_blendv_ps(_mm256_mul_ps(t, u), _mm256_mul_ps(x, u), big);
            _mm256_storeu_ps(g.as_mut_ptr(), _mm256_andnot_ps(low, r));
        }
    }
}

/// SwiGLU in place: `gate[i] = silu(gate[i]) * up[i]`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    swiglu_with(Isa::detect(), gate, up)
}

/// [`swiglu`] on an explicit instruction set (every one gives the same bits).
pub fn swiglu_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: shape");
    let body = gate.len() / LANES * LANES;
    let (g, u) = (&mut gate[..body], &up[..body]);
    match isa {
        Isa::Portable => swiglu_body(g, u),
        // SAFETY: Avx2 is only detected when the CPU has avx2 and fma.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { swiglu_avx2(g, u) },
        // SAFETY: Avx512 is only detected when the CPU has avx512f.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { swiglu_avx512(g, u) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => swiglu_body(g, u),
    }
    for (g, u) in gate[body..].iter_mut().zip(&up[body..]) {
        *g = silu_libm(*g) * u;
    }
}

#[inline(always)]
fn swiglu_body(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use std::arch::x86_64::*;
        debug_assert_eq!(gate.len() % 8, 0);
        let one = _mm256_set1_ps(1.0);
        for (g, u) in gate.chunks_exact_mut(8).zip(up.chunks_exact(8)) {
            let x = _mm256_loadu_ps(g.as_ptr());
            let e = crate::expf::x86::expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
            _mm256_storeu_ps(
                g.as_mut_ptr(),
                _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr())),
            );
        }
    }
}

/// [`swiglu_body`] sixteen lanes at a time, ggml's own vector width (same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn swiglu_avx512(gate: &mut [f32], up: &[f32]) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use std::arch::x86_64::*;
        debug_assert_eq!(gate.len() % LANES, 0);
        let one = _mm512_set1_ps(1.0);
        for (g, u) in gate.chunks_exact_mut(LANES).zip(up.chunks_exact(LANES)) {
            let x = _mm512_loadu_ps(g.as_ptr());
            let e = crate::expf::x86::expf16(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let s = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_storeu_ps(
                g.as_mut_ptr(),
                _mm512_mul_ps(s, _mm512_loadu_ps(u.as_ptr())),
            );
        }
    }
}

/// Numerically stable softmax in place (max subtracted first), as ggml's `soft_max` sums it.
/// Empty input is left as is.
pub fn softmax(x: &mut [f32]) {
    softmax_with(Isa::detect(), x)
}

/// [`softmax`] on an explicit instruction set (every one gives the same bits).
pub fn softmax_with(isa: Isa, x: &mut [f32]) {
    match isa {
        Isa::Portable => softmax_blocks(x, false),
        // SAFETY: Avx2 is only detected when the CPU has avx2 and fma.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { softmax_blocks_avx2(x, false) },
        // SAFETY: Avx512 is only detected when the CPU has avx512f.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { softmax_blocks_avx512(x, false) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => softmax_blocks(x, false),
    }
}

/// Softmax over `x`. With `padded`, the row is taken to continue with masked (-inf) entries
/// up to a multiple of 16, as attention rows do in llama.cpp's padded KV cache, so the last
/// block also goes through the vectorized `exp`; otherwise a short tail uses libm's.
#[inline(always)]
pub(crate) fn softmax_blocks(x: &mut [f32], padded: bool) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    let mut blocks = x.chunks_exact_mut(LANES);
    for b in &mut blocks {
        let mut e = [0f32; LANES];
        for (o, v) in e.iter_mut().zip(b.iter()) {
            *o = expf(*v - max);
        }
        b.copy_from_slice(&e);
        sum += reduce16(&e) as f64;
    }
    let tail = blocks.into_remainder();
    if padded && !tail.is_empty() {
        let mut e = [0f32; LANES];
        for (o, v) in e.iter_mut().zip(tail.iter()) {
            *o = expf(*v - max);
        }
        tail.copy_from_slice(&e[..tail.len()]);
        sum += reduce16(&e) as f64;
    } else {
        for v in tail.iter_mut() {
            *v = (*v - max).exp();
            sum += *v as f64;
        }
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Attention's softmax: [`softmax_blocks`] over a padded row, vectorized on `isa`.
#[inline(always)]
pub(crate) fn softmax_padded(isa: Isa, x: &mut [f32]) {
    match isa {
        Isa::Portable => softmax_blocks(x, true),
        // SAFETY: Avx2 is only detected when the CPU has avx2 and fma.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { softmax_blocks_avx2(x, true) },
        // SAFETY: Avx512 is only detected when the CPU has avx512f.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { softmax_blocks_avx512(x, true) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => softmax_blocks(x, true),
    }
}

/// [`softmax_blocks`] one 16-lane register a block, as ggml runs it (same bits): the
/// maximum, the exponentials, each block's sum and the scaling all in registers.
///
/// # Safety
/// The CPU must support AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f")]
pub(crate) unsafe fn softmax_blocks_avx512(x: &mut [f32], padded: bool) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use crate::expf::x86::{expf16, reduce16_zmm};
        use std::arch::x86_64::*;
        let n = x.len();
        let body = n / LANES * LANES;
        let p = x.as_mut_ptr();
        // A masked tail loads -inf, which neither raises the maximum nor adds to the sum.
        let tail_mask: __mmask16 = ((1u32 << (n - body)) - 1) as __mmask16;
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut mv = ninf;
        for i in (0..body).step_by(LANES) {
            mv = _mm512_max_ps(mv, _mm512_loadu_ps(p.add(i)));
        }
        mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(ninf, tail_mask, p.add(body)));
        let max = _mm512_reduce_max_ps(mv);
        let m = _mm512_set1_ps(max);
        let mut sum = 0f64;
        for i in (0..body).step_by(LANES) {
            let e = expf16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), m));
            _mm512_storeu_ps(p.add(i), e);
            sum += reduce16_zmm(e) as f64;
        }
        let tail = &mut x[body..];
        if padded && !tail.is_empty() {
            let v = _mm512_mask_loadu_ps(ninf, tail_mask, tail.as_ptr());
            let e = expf16(_mm512_sub_ps(v, m));
            _mm512_mask_storeu_ps(tail.as_mut_ptr(), tail_mask, e);
            sum += reduce16_zmm(e) as f64;
        } else {
            for v in tail.iter_mut() {
                *v = (*v - max).exp();
                sum += *v as f64;
            }
        }
        let inv = _mm512_set1_ps((1.0 / sum) as f32);
        for i in (0..body).step_by(LANES) {
            _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), inv));
        }
        let t = _mm512_mask_loadu_ps(_mm512_setzero_ps(), tail_mask, p.add(body));
        _mm512_mask_storeu_ps(p.add(body), tail_mask, _mm512_mul_ps(t, inv));
    }
}

/// [`softmax_blocks`] with each block's `exp` computed eight lanes at a time (same bits).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn softmax_blocks_avx2(x: &mut [f32], padded: bool) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use crate::expf::x86::expf8;
        use std::arch::x86_64::*;
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m = _mm256_set1_ps(max);
        let mut sum = 0f64;
        let mut blocks = x.chunks_exact_mut(LANES);
        for b in &mut blocks {
            let p = b.as_mut_ptr();
            _mm256_storeu_ps(p, expf8(_mm256_sub_ps(_mm256_loadu_ps(p), m)));
            _mm256_storeu_ps(p.add(8), expf8(_mm256_sub_ps(_mm256_loadu_ps(p.add(8)), m)));
            let e: &[f32; LANES] = (&*b).try_into().expect("16 lanes");
            sum += reduce16(e) as f64;
        }
        let tail = blocks.into_remainder();
        if padded && !tail.is_empty() {
            // Masked lanes: exp(-inf) = 0.
            let mut e = [f32::NEG_INFINITY; LANES];
            e[..tail.len()].copy_from_slice(tail);
            let p = e.as_mut_ptr();
            _mm256_storeu_ps(p, expf8(_mm256_sub_ps(_mm256_loadu_ps(p), m)));
            _mm256_storeu_ps(p.add(8), expf8(_mm256_sub_ps(_mm256_loadu_ps(p.add(8)), m)));
            tail.copy_from_slice(&e[..tail.len()]);
            sum += reduce16(&e) as f64;
        } else {
            for v in tail.iter_mut() {
                *v = (*v - max).exp();
                sum += *v as f64;
            }
        }
        let inv = (1.0 / sum) as f32;
        x.iter_mut().for_each(|v| *v *= inv);
    }
}
