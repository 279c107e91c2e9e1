//! K-quant super-blocks of sixteen rows interleaved, for the 512-bit kernels
//! (`kquant_avx512.rs`) and, half a group per register, the AVX2 ones (`packed_k_avx2.rs`):
//! [`PackedRows`](super::packed::PackedRows) records of Q4_K and Q6_K.
//!
//! A record holds one super-block (256 elements) of each of the group's [`GROUP`] rows, as
//! `packed.rs`'s do for 32-element blocks: per-row scales first, then the quants
//! dword-interleaved (line `L`, bytes `4r..4r + 4`: row `r`'s four quants of line `L`), so one
//! 64-byte load feeds a `vpdpbusd` (or `vpmaddubsw`) sixteen rows at once.
//!
//! Q4_K (37 lines, 2% more than the file's 16 x 144 bytes):
//! - line 0: the sixteen f16 `d`, then the sixteen f16 `dmin`;
//! - lines 1-2: the 6-bit sub-block scales, byte `16j + r` = row `r`'s scale of sub-block `j`;
//! - lines 3-4: the sub-block minimums, the same way;
//! - lines 5-36: quant line `8c + i` holds bytes `32c + 4i..32c + 4i + 4` of each row's
//!   nibbles: low nibbles are elements `64c + 4i..`, of sub-block `2c`; high nibbles are
//!   elements `64c + 32 + 4i..`, of sub-block `2c + 1`.
//!
//! Q6_K (53 lines, 1% more than the file's 16 x 210 bytes: six bits a value, as in the file,
//! arranged so that each value line comes out of one nibble line and one high line in three
//! instructions; decode reads every byte of the matrix once a step, so the record's size is
//! its time):
//! - line 0: the sixteen f16 `d`;
//! - lines 1-4: the i8 scales, byte `16s + r` (of line `1 + s / 4`) = row `r`'s scale `s`;
//! - value line `L` (0..64) is elements `4L..4L + 4` of each row plus 32 (0..=63), bytes
//!   `4r..4r + 4` row `r`'s; it is stored split into nibble lines and high lines:
//!   - nibble line `N` (0..32): value line `N`'s low four bits in each byte's low nibble,
//!     value line `N + 32`'s in its high nibble;
//!   - high line `H` (0..16): bits `2i, 2i + 1` of each byte are bits 4 and 5 of value line
//!     `H + 16i` (`i` in 0..4).
//! - lines 5-52: the nibble and high lines grouped by ggml lane, in the order the kernel reads
//!   them: all of lane `m`'s value lines (`8 run + m`, `kquant_avx512::q6_k`) come from high
//!   lines `m, m + 8` and nibble lines `m, m + 8, m + 16, m + 24`, which are lines
//!   `5 + 6m ..= 10 + 6m` in that order ([`q6_k_high_line`], [`q6_k_nibble_line`]). Walked in
//!   order, a record is read front to back: the hardware prefetchers follow that. Interleaved
//!   by kind (all nibble lines, then all high lines), a lane's six lines lay 512 bytes apart,
//!   and on a Zen 4 (family 25 model 17) a Q6_K product from memory ran at 9 GB/s on one core
//!   beside 25 GB/s from cache, with the prefetch requests of `packed::prefetch_ahead` or
//!   without.

use super::packed::{Line, GROUP};
use super::QMatrix;
use crate::quant::WeightType;
use crate::quant_k::{q6_k_scales, q6_k_values, scales_mins, Q6_K_D};

/// Lines of a Q4_K record.
pub(crate) const Q4_K_LINES: usize = 37;
/// Lines of a Q6_K record.
pub(crate) const Q6_K_LINES: usize = 53;
/// First quant line of a Q4_K record.
pub(crate) const Q4_K_QUANTS: usize = 5;
/// First scale line of a Q6_K record.
pub(crate) const Q6_K_SCALES: usize = 1;
/// First line of a Q6_K record's lanes (six lines each).
const Q6_K_LANES: usize = 5;

/// The record line that holds nibble line `n` (0..32) of a Q6_K record.
pub(crate) const fn q6_k_nibble_line(n: usize) -> usize {
    Q6_K_LANES + 6 * (n % 8) + 2 + n / 8
}

/// The record line that holds high line `h` (0..16) of a Q6_K record.
pub(crate) const fn q6_k_high_line(h: usize) -> usize {
    Q6_K_LANES + 6 * (h % 8) + h / 8
}

/// Writes the record of super-block `b` of rows `g * GROUP..` of `w` into `out`.
pub(crate) fn pack_record(w: &QMatrix<'_>, g: usize, b: usize, out: &mut [Line]) {
    let bytes = w.ty.block_bytes();
    let mut rec = vec![0u8; out.len() * 64];
    for r in 0..GROUP {
        let blk = &w.row(g * GROUP + r)[b * bytes..][..bytes];
        match w.ty {
            WeightType::Q4_K => pack_q4_k(blk, r, &mut rec),
            WeightType::Q6_K => pack_q6_k(blk, r, &mut rec),
            other => unreachable!("{other:?} has no K-quant record"),
        }
    }
    for (line, src) in out.iter_mut().zip(rec.chunks_exact(64)) {
        line.0.copy_from_slice(src);
    }
}

fn pack_q4_k(blk: &[u8], r: usize, rec: &mut [u8]) {
    rec[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
    rec[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&blk[2..4]);
    let (sc, m) = scales_mins(blk);
    for j in 0..8 {
        rec[64 + 16 * j + r] = sc[j];
        rec[3 * 64 + 16 * j + r] = m[j];
    }
    let qs = &blk[16..144];
    for line in 0..32 {
        let (c, i) = (line / 8, line % 8);
        let at = (Q4_K_QUANTS + line) * 64 + 4 * r;
        rec[at..at + 4].copy_from_slice(&qs[32 * c + 4 * i..][..4]);
    }
}

fn pack_q6_k(blk: &[u8], r: usize, rec: &mut [u8]) {
    rec[2 * r..2 * r + 2].copy_from_slice(&blk[Q6_K_D..Q6_K_D + 2]);
    let sc = q6_k_scales(blk);
    // Stored plus 32 (0..=63), as ggml's kernel multiplies them (`kquant_portable`).
    let q = q6_k_values(blk).map(|v| (v + 32) as u8);
    for (s, &v) in sc.iter().enumerate() {
        rec[Q6_K_SCALES * 64 + 16 * s + r] = v as u8;
    }
    // Element `k` of value line `line` for this row.
    let v = |line: usize, k: usize| q[4 * line + k];
    for k in 0..4 {
        for n in 0..32 {
            rec[q6_k_nibble_line(n) * 64 + 4 * r + k] = (v(n, k) & 0x0F) | (v(n + 32, k) << 4);
        }
        for h in 0..16 {
            rec[q6_k_high_line(h) * 64 + 4 * r + k] =
                (0..4).fold(0, |b, i| b | ((v(h + 16 * i, k) >> 4) << (2 * i)));
        }
    }
}
