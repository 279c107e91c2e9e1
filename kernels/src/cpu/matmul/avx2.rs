//! x86-64 kernels for `Isa::Avx2` and `Isa::Avx512`. Each quantized kernel unpacks one weight
//! block and multiplies it with up to four tokens' activation blocks, accumulating per token in
//! eight f32 lanes exactly as ggml's `vec_dot_q4_1_q8_1` & co. do. The 8-bit products run as
//! `maddubs` + `madd` on AVX2 and as one `vpdpbusd` with AVX-512 VNNI (u8 x i8, the sign trick
//! for signed weights); both give the same 32-bit lane sums, so both paths have the same bits.

use super::dest::Dest;
use super::packed::{GROUP as PACKED_GROUP, Q5_0_HIGH_LINE as PACKED_Q5_0_HIGH_LINE};
use super::{portable, Acts, KOrder, QMatrix};
use crate::act::QuantizedActs;
use crate::quant::{WeightType, QK};

/// Tokens per tile: each weight block is unpacked once for this many tokens.
const TILE: usize = 4;

/// Rows `r0..r0 + n` of `w`'s whole packed groups for every token into `out`; returns how
/// many rows it did (none unless `w` is packed and `r0` starts a group). Several tokens
/// (prefill) take the kernel that unpacks a record once for up to eight of them; one token
/// (decode) the one that keeps a group's lanes in registers. A packed Q4_K or Q6_K matrix's
/// groups take the half-group kernels (AVX2 only: the 512-bit kernels took them before a
/// VNNI call gets here).
pub(super) fn packed_rows(
    vnni: bool,
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    acts: &Acts<'_>,
    tokens: usize,
    out: Dest<'_>,
) -> usize {
    // A wide packing is the 512-bit kernels' alone: its rows take the plain-row kernels here.
    if w.packed.is_some_and(|p| p.wide()) {
        return 0;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only selected when avx2, fma and f16c
        // were detected; the kernels check the shapes.
        unsafe {
            match acts {
                Acts::Quant(a) if tokens > 1 && !vnni => {
                    super::packed_avx2::run_groups(w, r0, n, a, tokens, out)
                }
                Acts::Quant(a) => {
                    super::packed::run_groups(x86::packed_group, None, w, r0, n, a, tokens, out)
                }
                Acts::QuantK(a) if !vnni => {
                    super::packed_k_avx2::run_groups(w, r0, n, a, tokens, out)
                }
                _ => 0,
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (vnni, w, r0, n, acts, tokens, out);
        0
    }
}

pub(super) fn rows(
    vnni: bool,
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    acts: &Acts<'_>,
    tokens: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        match acts {
            Acts::Quant(a) => {
                assert_eq!(a.qs.len(), tokens * w.cols);
                assert_eq!(a.d.len(), tokens * a.blocks());
            }
            Acts::QuantK(a) => {
                assert_eq!(a.qs.len(), tokens * w.cols);
                assert_eq!(a.d.len(), tokens * a.blocks());
                assert_eq!(a.bsums.len(), tokens * a.blocks() * 16);
            }
            Acts::Float(_) => {}
        }
        let done = packed_rows(vnni, w, r0, n, acts, tokens, Dest::by_row(out, tokens));
        let (r0, n, out) = (r0 + done, n - done, &mut out[done * tokens..]);
        if let Acts::Quant(a) = acts {
            // SAFETY: as for the tiles below; shapes were checked above.
            unsafe {
                if vnni {
                    x86::rows_q8_vnni(w, r0, n, a, tokens, out)
                } else {
                    x86::rows_q8(w, r0, n, a, tokens, out)
                }
            };
            return;
        }
        // A whole tile takes one K-quant order (tiles start at multiples of four, so only the
        // last, short one of a repacked Q4_K matrix is gemv).
        let mut t0 = 0;
        while t0 < tokens {
            let nt = (tokens - t0).min(TILE);
            let order = KOrder::of(w, t0, tokens);
            for i in 0..n {
                let row = w.row(r0 + i);
                let o = &mut out[i * tokens + t0..i * tokens + t0 + nt];
                // SAFETY: `Isa::Avx2` is only selected when avx2, fma and f16c were detected,
                // `Isa::Avx512` (vnni) when avx512f/bw/vl/vnni were too; slice lengths were
                // checked above and by `QMatrix::new`.
                unsafe {
                    if vnni {
                        x86::tile_vnni(w.ty, order, row, acts, w.cols, t0, o)
                    } else {
                        x86::tile(w.ty, order, row, acts, w.cols, t0, o)
                    }
                };
            }
            t0 += nt;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = vnni;
        portable::rows(w, r0, n, acts, tokens, out)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::matmul::kquant_avx2 as kquant;
    use crate::matmul::packed::PackedRows;
    use crate::matmul::packed_avx2::high_bit;
    use std::arch::x86_64::*;

    /// Dispatches one row x `out.len()` tokens tile (AVX2).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile(
        ty: WeightType,
        order: KOrder,
        row: &[u8],
        acts: &Acts<'_>,
        cols: usize,
        t0: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe { tile_body::<false>(ty, order, row, acts, cols, t0, out) }
    }

    /// [`tile`] with AVX-512 VNNI's `vpdpbusd` for the integer products (same bits).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn tile_vnni(
        ty: WeightType,
        order: KOrder,
        row: &[u8],
        acts: &Acts<'_>,
        cols: usize,
        t0: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe { tile_body::<true>(ty, order, row, acts, cols, t0, out) }
    }

    /// Rows `r0..r0 + n` of a Q4_0/Q4_1/Q5_0/Q8_0 matrix for all tokens (AVX2).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_q8(
        w: &QMatrix<'_>,
        r0: usize,
        n: usize,
        a: &QuantizedActs,
        tokens: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe { rows_q8_body::<false>(w, r0, n, a, tokens, out) }
    }

    /// [`rows_q8`] with AVX-512 VNNI's `vpdpbusd` (same bits).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn rows_q8_vnni(
        w: &QMatrix<'_>,
        r0: usize,
        n: usize,
        a: &QuantizedActs,
        tokens: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe { rows_q8_body::<true>(w, r0, n, a, tokens, out) }
    }

    /// Tiles of four tokens by one row; a single token (decode) takes four rows at a time,
    /// whose accumulation chains then overlap.
    #[inline(always)]
    unsafe fn rows_q8_body<const VNNI: bool>(
        w: &QMatrix<'_>,
        r0: usize,
        n: usize,
        a: &QuantizedActs,
        tokens: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let mut t0 = 0;
            while t0 < tokens {
                let nt = (tokens - t0).min(TILE);
                let mut i = 0;
                if nt == 1 {
                    while i + 4 <= n {
                        let rows = [
                            w.row(r0 + i),
                            w.row(r0 + i + 1),
                            w.row(r0 + i + 2),
                            w.row(r0 + i + 3),
                        ];
                        let r = quant_rows::<4, 1, VNNI>(w.ty, rows, a, t0);
                        for (k, rk) in r.iter().enumerate() {
                            out[(i + k) * tokens + t0] = rk[0];
                        }
                        i += 4;
                    }
                }
                for i in i..n {
                    let o = &mut out[i * tokens + t0..i * tokens + t0 + nt];
                    let row = w.row(r0 + i);
                    match nt {
                        4 => o.copy_from_slice(&quant::<4, VNNI>(w.ty, row, a, t0)),
                        3 => o.copy_from_slice(&quant::<3, VNNI>(w.ty, row, a, t0)),
                        2 => o.copy_from_slice(&quant::<2, VNNI>(w.ty, row, a, t0)),
                        _ => o.copy_from_slice(&quant::<1, VNNI>(w.ty, row, a, t0)),
                    }
                }
                t0 += nt;
            }
        }
    }

    #[inline(always)]
    unsafe fn tile_body<const VNNI: bool>(
        ty: WeightType,
        order: KOrder,
        row: &[u8],
        acts: &Acts<'_>,
        cols: usize,
        t0: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            match (ty, acts, order) {
                (
                    WeightType::Q4_0 | WeightType::Q4_1 | WeightType::Q5_0 | WeightType::Q8_0,
                    Acts::Quant(a),
                    _,
                ) => match out.len() {
                    4 => out.copy_from_slice(&quant::<4, VNNI>(ty, row, a, t0)),
                    3 => out.copy_from_slice(&quant::<3, VNNI>(ty, row, a, t0)),
                    2 => out.copy_from_slice(&quant::<2, VNNI>(ty, row, a, t0)),
                    _ => out.copy_from_slice(&quant::<1, VNNI>(ty, row, a, t0)),
                },
                (WeightType::Q4_K, Acts::QuantK(a), KOrder::Repacked(route)) => match out.len() {
                    4 => out.copy_from_slice(&kquant::tile_repacked::<4, VNNI>(route, row, a, t0)),
                    3 => out.copy_from_slice(&kquant::tile_repacked::<3, VNNI>(route, row, a, t0)),
                    2 => out.copy_from_slice(&kquant::tile_repacked::<2, VNNI>(route, row, a, t0)),
                    _ => out.copy_from_slice(&kquant::tile_repacked::<1, VNNI>(route, row, a, t0)),
                },
                (WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K, Acts::QuantK(a), _) => {
                    let tiled = order == KOrder::Tiled;
                    match out.len() {
                        4 => out.copy_from_slice(&kquant::tile::<4, VNNI>(ty, tiled, row, a, t0)),
                        3 => out.copy_from_slice(&kquant::tile::<3, VNNI>(ty, tiled, row, a, t0)),
                        2 => out.copy_from_slice(&kquant::tile::<2, VNNI>(ty, tiled, row, a, t0)),
                        _ => out.copy_from_slice(&kquant::tile::<1, VNNI>(ty, tiled, row, a, t0)),
                    }
                }
                (WeightType::F32, Acts::Float(x), _) => {
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = dot_f32(row, &x[(t0 + j) * cols..][..cols]);
                    }
                }
                (WeightType::F16, Acts::Float(x), _) => {
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = dot_f16(row, &x[(t0 + j) * cols..][..cols]);
                    }
                }
                (ty, _, _) => unreachable!("activations prepared for the wrong type {ty:?}"),
            }
        }
    }

    /// Group `g` of `pk` (sixteen rows) against token `t`'s activations: `packed.rs`'s
    /// records, eight rows per register (`maddubs` + `madd` form the same 32-bit lanes as
    /// `vpdpbusd`; Q8_0's bytes are turned back to signed for ggml's sign trick, since
    /// `maddubs` would saturate on the offset ones).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn packed_group(
        pk: &PackedRows,
        g: usize,
        a: &QuantizedActs,
        t: usize,
    ) -> [f32; PACKED_GROUP] {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let mut out = [0f32; PACKED_GROUP];
            for h in 0..2 {
                let r = match pk.ty() {
                    WeightType::Q4_0 => packed_half::<Q4_0>(pk, g, h, a, t),
                    WeightType::Q4_1 => packed_half::<Q4_1>(pk, g, h, a, t),
                    WeightType::Q8_0 => packed_half::<Q8_0>(pk, g, h, a, t),
                    WeightType::Q5_0 => packed_half::<Q5_0>(pk, g, h, a, t),
                    other => unreachable!("{other:?} is never packed"),
                };
                out[8 * h..8 * h + 8].copy_from_slice(&r);
            }
            out
        }
    }

    /// Rows `8h..8h + 8` of group `g`: `acc[k]` holds, in lane `r`, row `8h + r`'s ggml lane
    /// `k`, as in the 512-bit kernel.
    #[inline(always)]
    unsafe fn packed_half<const TY: u8>(
        pk: &PackedRows,
        g: usize,
        h: usize,
        a: &QuantizedActs,
        t: usize,
    ) -> [f32; 8] {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let nb = a.blocks();
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut msum = _mm256_setzero_ps();
            let low = _mm256_set1_epi8(0x0F);
            let ones8 = _mm256_set1_epi8(1);
            let ones16 = _mm256_set1_epi16(1);
            let qy = a.qs.as_ptr().add(t * a.cols);
            for b in 0..nb {
                let rec = pk.record(g, b);
                let yb = qy.add(b * QK);
                let k = t * nb + b;
                let dy = *a.d.get_unchecked(k);
                let dw = _mm256_cvtph_ps(_mm_load_si128(rec.add(16 * h) as *const __m128i));
                let sc = _mm256_mul_ps(dw, _mm256_set1_ps(dy));
                if TY == Q4_1 {
                    let mw =
                        _mm256_cvtph_ps(_mm_load_si128(rec.add(32 + 16 * h) as *const __m128i));
                    let s = *a.s.get_unchecked(k);
                    msum = _mm256_add_ps(msum, _mm256_mul_ps(mw, _mm256_set1_ps(s)));
                }
                // Q4_0's lanes start from `-8 * sum(y)` over their four activations, Q5_0's from
                // `-16 * sum(y)`.
                let mut init = [0i32; 8];
                if TY == Q4_0 || TY == Q5_0 {
                    let y = _mm256_loadu_si256(yb as *const __m256i);
                    let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, y), ones16);
                    let sums = if TY == Q4_0 {
                        _mm256_slli_epi32::<3>(sums)
                    } else {
                        _mm256_slli_epi32::<4>(sums)
                    };
                    let c = _mm256_sub_epi32(_mm256_setzero_si256(), sums);
                    _mm256_storeu_si256(init.as_mut_ptr() as *mut __m256i, c);
                }
                let y4 =
                    |k: usize| _mm256_set1_epi32((yb.add(4 * k) as *const i32).read_unaligned());
                let q = rec.add(64 + 32 * h);
                if TY == Q8_0 {
                    let flip = _mm256_set1_epi8(0x80u8 as i8);
                    for (k, a) in acc.iter_mut().enumerate() {
                        let w = _mm256_xor_si256(
                            _mm256_load_si256(q.add(64 * k) as *const __m256i),
                            flip,
                        );
                        let p = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(
                                _mm256_sign_epi8(w, w),
                                _mm256_sign_epi8(y4(k), w),
                            ),
                            ones16,
                        );
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, *a);
                    }
                } else {
                    let qh = if TY == Q5_0 {
                        _mm256_load_si256(q.add(64 * (PACKED_Q5_0_HIGH_LINE - 1)) as *const __m256i)
                    } else {
                        _mm256_setzero_si256()
                    };
                    for j in 0..4 {
                        let v = _mm256_load_si256(q.add(64 * j) as *const __m256i);
                        let mut lo = _mm256_and_si256(v, low);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                        if TY == Q5_0 {
                            // Values `w + 16` (0..=31): `maddubs` pairs stay far from saturating.
                            lo = _mm256_or_si256(lo, high_bit(qh, 2 * j));
                            hi = _mm256_or_si256(hi, high_bit(qh, 2 * j + 1));
                        }
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y4(j)), ones16);
                        let p = _mm256_add_epi32(p, _mm256_set1_epi32(init[j]));
                        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[j]);
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y4(j + 4)), ones16);
                        let p = _mm256_add_epi32(p, _mm256_set1_epi32(init[j + 4]));
                        acc[j + 4] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[j + 4]);
                    }
                }
            }
            // ggml's horizontal sum, for eight rows at once (see the 512-bit kernel).
            let s0 = _mm256_add_ps(acc[0], acc[4]);
            let s1 = _mm256_add_ps(acc[1], acc[5]);
            let s2 = _mm256_add_ps(acc[2], acc[6]);
            let s3 = _mm256_add_ps(acc[3], acc[7]);
            let mut r = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
            if TY == Q4_1 {
                r = _mm256_add_ps(r, msum);
            }
            let mut out = [0f32; 8];
            _mm256_storeu_ps(out.as_mut_ptr(), r);
            out
        }
    }

    /// The sum of the eight lanes in ggml's order (halves, then pairs, then the last two).
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// The little-endian f16 at `p` as f32, with F16C (exact, so the same value as `half`).
    #[inline(always)]
    unsafe fn f16_load(p: *const u8) -> f32 {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let bits = u16::from_le_bytes([*p, *p.add(1)]);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
        }
    }

    /// Sums of four adjacent u8 x i8 products per 32-bit lane.
    #[inline(always)]
    unsafe fn dot_u8i8<const VNNI: bool>(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            if VNNI {
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
            } else {
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
            }
        }
    }

    /// Weight types as const parameters, so the block loop has no type dispatch.
    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q8_0: u8 = 2;
    const Q5_0: u8 = 3;

    /// One quantized row against `NT` consecutive tokens starting at `t0`.
    #[inline(always)]
    unsafe fn quant<const NT: usize, const VNNI: bool>(
        ty: WeightType,
        row: &[u8],
        a: &QuantizedActs,
        t0: usize,
    ) -> [f32; NT] {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe { quant_rows::<1, NT, VNNI>(ty, [row], a, t0)[0] }
    }

    /// `NR` quantized rows against `NT` consecutive tokens starting at `t0`: every
    /// (row, token) pair is its own accumulation, in the one-row order.
    #[inline(always)]
    unsafe fn quant_rows<const NR: usize, const NT: usize, const VNNI: bool>(
        ty: WeightType,
        rows: [&[u8]; NR],
        a: &QuantizedActs,
        t0: usize,
    ) -> [[f32; NT]; NR] {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            match ty {
                WeightType::Q4_0 => quant_ty::<NR, NT, VNNI, Q4_0>(rows, a, t0),
                WeightType::Q4_1 => quant_ty::<NR, NT, VNNI, Q4_1>(rows, a, t0),
                WeightType::Q5_0 => quant_ty::<NR, NT, VNNI, Q5_0>(rows, a, t0),
                WeightType::Q8_0 => quant_ty::<NR, NT, VNNI, Q8_0>(rows, a, t0),
                other => unreachable!("{other:?} does not take Q8 activations"),
            }
        }
    }

    /// [`quant_rows`] for the weight type `TY`. Several rows at once share each activation
    /// load and run independent accumulation chains side by side (one row's chain is bound
    /// by the latency of its fused multiply-adds).
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn quant_ty<const NR: usize, const NT: usize, const VNNI: bool, const TY: u8>(
        rows: [&[u8]; NR],
        a: &QuantizedActs,
        t0: usize,
    ) -> [[f32; NT]; NR] {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let nb = a.blocks();
            let bb = match TY {
                Q4_0 => 18,
                Q4_1 => 20,
                Q5_0 => 22,
                _ => 34,
            };
            for row in &rows {
                debug_assert_eq!(row.len(), nb * bb);
            }
            let mut acc = [[_mm256_setzero_ps(); NT]; NR];
            // Q4_1's `sum(m * s)`, in lane 1 (lane 0 collects products nobody reads): the scale
            // products `[dw * dy, mw * s]` come from one multiply of `[dw, mw]` by `[dy, s]`.
            let mut msum = [[_mm_setzero_ps(); NT]; NR];
            let eight = _mm256_set1_epi8(8);
            let high_nibble = _mm256_set1_epi8(0xF0u8 as i8);
            let qp = a.qs.as_ptr();
            for b in 0..nb {
                let mut y = [_mm256_setzero_si256(); NT];
                let mut dy = [0f32; NT];
                let mut dys = [_mm_setzero_ps(); NT];
                for j in 0..NT {
                    let k = (t0 + j) * nb + b;
                    y[j] = _mm256_loadu_si256(qp.add((t0 + j) * a.cols + b * QK) as *const __m256i);
                    dy[j] = *a.d.get_unchecked(k);
                    if TY == Q4_1 {
                        dys[j] =
                            _mm_unpacklo_ps(_mm_set_ss(dy[j]), _mm_set_ss(*a.s.get_unchecked(k)));
                    }
                }
                for i in 0..NR {
                    let blk = rows[i].as_ptr().add(b * bb);
                    match TY {
                        Q4_1 => {
                            // [dw, mw]: the block's two f16 values converted together (exact).
                            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(
                                (blk as *const i32).read_unaligned(),
                            ));
                            let w = nibbles(blk.add(4));
                            for j in 0..NT {
                                let p = dot_u8i8::<VNNI>(w, y[j]);
                                let prod = _mm_mul_ps(dm, dys[j]);
                                let sc = _mm256_broadcastss_ps(prod);
                                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[i][j]);
                                msum[i][j] = _mm_add_ps(msum[i][j], prod);
                            }
                        }
                        _ => {
                            let dw = f16_load(blk);
                            // Signed weights: Q4_0 and Q5_0 unpacked to -8..7 / -16..15, Q8_0
                            // as is.
                            let w = match TY {
                                Q4_0 => _mm256_sub_epi8(nibbles(blk.add(2)), eight),
                                Q5_0 => {
                                    let w = nibbles(blk.add(6));
                                    let qh = (blk.add(2) as *const u32).read_unaligned();
                                    // A clear high bit makes the value negative: nibble - 16.
                                    let neg = _mm256_andnot_si256(bits_to_bytes(qh), high_nibble);
                                    _mm256_or_si256(w, neg)
                                }
                                _ => _mm256_loadu_si256(blk.add(2) as *const __m256i),
                            };
                            let aw = _mm256_sign_epi8(w, w);
                            for j in 0..NT {
                                let p = dot_u8i8::<VNNI>(aw, _mm256_sign_epi8(y[j], w));
                                let sc = _mm256_set1_ps(dw * dy[j]);
                                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[i][j]);
                            }
                        }
                    }
                }
            }
            let mut out = [[0f32; NT]; NR];
            for i in 0..NR {
                for j in 0..NT {
                    out[i][j] = hsum(acc[i][j]) + _mm_cvtss_f32(_mm_movehdup_ps(msum[i][j]));
                }
            }
            out
        }
    }

    /// The 32 nibbles of 16 bytes at `p` in element order: low nibbles, then high nibbles.
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let qs = _mm_loadu_si128(p as *const __m128i);
            let w = _mm256_set_m128i(_mm_srli_epi16(qs, 4), qs);
            _mm256_and_si256(w, _mm256_set1_epi8(0x0F))
        }
    }

    /// Byte `i` is 0xFF where bit `i` of `x` is set, else 0 (ggml's `bytes_from_bits_32`).
    #[inline(always)]
    unsafe fn bits_to_bytes(x: u32) -> __m256i {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let pick = _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            );
            let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), pick);
            let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
            _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi64x(-1))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let n = x.len() / 8 * 8;
            let mut acc = _mm256_setzero_ps();
            for i in (0..n).step_by(8) {
                let w = _mm256_loadu_ps(row.as_ptr().add(i * 4) as *const f32);
                acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(i)), acc);
            }
            hsum(acc) + portable::dot_f32(&row[n * 4..], &x[n..])
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let n = x.len() / 8 * 8;
            let mut acc = _mm256_setzero_ps();
            for i in (0..n).step_by(8) {
                let w = _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(i * 2) as *const __m128i));
                acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(i)), acc);
            }
            hsum(acc) + portable::dot_f16(&row[n * 2..], &x[n..])
        }
    }
}
