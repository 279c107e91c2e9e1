//! Weight rows interleaved sixteen at a time, for the x86 kernels (`Isa::Avx512` takes a group
//! per register, `Isa::Avx2` half a group).
//!
//! In a GGUF row-major matrix each 32-element block is one row's scale(s) and quants. Here,
//! for every group of [`GROUP`] rows and every block index, the group's sixteen blocks sit in
//! one 64-byte-aligned record: first the sixteen f16 scales (Q4_1: then the sixteen f16
//! minimums), then the quants dword-interleaved, so that one 64-byte load holds the same four
//! bytes of all sixteen rows. A `vpdpbusd` against four activation bytes broadcast to every
//! lane then yields, in lane `r`, row `r`'s sum of four products: exactly the 32-bit lane that
//! ggml's AVX2 kernel forms for that row. Keeping those eight lanes apart per row, in eight
//! registers, keeps ggml's float order and so its bits (`avx512.rs`).
//!
//! Signed quants (Q4_0, Q5_0, Q8_0) are stored offset to unsigned (`w + 8` is Q4_0's nibble
//! as stored, `w + 16` Q5_0's nibble with its high bit, kept in a line of their own; Q8_0
//! stores `w ^ 0x80`, i.e. `w + 128`), and the kernel starts each lane from
//! `-offset * sum(y)` over the same four activations, so the integer lane is `sum(w * y)`,
//! exact: no sign trick per row. (AVX2's `maddubs` would saturate on Q8_0's offset bytes, so
//! that kernel flips them back and takes ggml's sign trick.)
//!
//! [`Packing::Compute`] widens Q5_0 for the 512-bit kernels: each element's `w + 16` in a
//! byte of its own, in eight quant lines laid out as Q8_0's, and no high-bit line. The kernel
//! then loads what it would have unpacked (the same bytes, so the same integer lanes and the
//! same bits) for 1.5x the bytes of the compact record: a trade for a model that only runs
//! prefill, whose products are compute-bound (`prefill_matmul q5_0 2048 640 64 1`: 58.5
//! GMAC/s compact, against Q8_0's 101 on a Zen 4), and never for decode, whose one-token steps
//! are bound by the bytes they read.

use memmap2::MmapMut;
use rayon::prelude::*;

use super::dest::Dest;
use super::{packed_k, QMatrix};
use crate::act::QuantizedActs;
use crate::isa::Isa;
use crate::quant::WeightType;

/// Rows per interleaved group.
pub const GROUP: usize = 16;

/// One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u8; 64]);

/// A packing's lines: zero pages of an anonymous mapping, in huge pages where the kernel
/// grants them (a 7B model packs gigabytes at load; 4 KiB pages cost a fault each).
struct LineBuf {
    map: MmapMut,
    len: usize,
}

impl LineBuf {
    /// `len` zero lines, or `None` when the mapping cannot be made.
    fn zeroed(len: usize) -> Option<LineBuf> {
        let map = MmapMut::map_anon(len.checked_mul(std::mem::size_of::<Line>())?).ok()?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Some(LineBuf { map, len })
    }

    fn as_slice(&self) -> &[Line] {
        // SAFETY: the mapping is page-aligned (so `Line`-aligned), `len` lines long, zeroed
        // (a valid `Line`), and borrowed no longer than `self`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<Line>(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [Line] {
        // SAFETY: as in `as_slice`, borrowed mutably no longer than `self`.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().cast::<Line>(), self.len) }
    }
}

/// What a packing is laid out for (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Packing {
    /// The fewest bytes: what decode's memory-bound steps want.
    #[default]
    Bandwidth,
    /// The fewest instructions where the kernels gain by more bytes (Q5_0 widened on
    /// [`Isa::Avx512`]): for a model that only runs prefill.
    Compute,
}

/// A matrix repacked into groups of [`GROUP`] interleaved rows (see the module doc).
pub struct PackedRows {
    ty: WeightType,
    rows: usize,
    cols: usize,
    /// Q5_0 one byte an element, without a high-bit line ([`Packing::Compute`]).
    wide: bool,
    lines: LineBuf,
}

impl std::fmt::Debug for PackedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedRows")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

impl PackedRows {
    /// Repacks `w` for this CPU's kernels ([`PackedRows::pack_for`] of [`Isa::detect`]).
    pub fn pack(w: &QMatrix<'_>) -> Option<PackedRows> {
        PackedRows::pack_for(Isa::detect(), w)
    }

    /// Repacks `w` for `isa`'s kernels, or `None` when its type has no interleaved kernel
    /// there (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K have one on AVX2 and AVX-512: `packed_k.rs`
    /// for the K-quants) or its rows are not whole groups.
    pub fn pack_for(isa: Isa, w: &QMatrix<'_>) -> Option<PackedRows> {
        PackedRows::pack_as(isa, w, Packing::Bandwidth)
    }

    /// As [`PackedRows::pack_for`], laid out for `packing`.
    pub fn pack_as(isa: Isa, w: &QMatrix<'_>, packing: Packing) -> Option<PackedRows> {
        let wide = packing == Packing::Compute && isa == Isa::Avx512 && w.ty == WeightType::Q5_0;
        let lines_per = record_lines(w.ty, wide)?;
        let k_quant = matches!(w.ty, WeightType::Q4_K | WeightType::Q6_K);
        if k_quant && isa == Isa::Portable {
            return None;
        }
        let bs = w.ty.block_size();
        if w.rows == 0 || !w.rows.is_multiple_of(GROUP) || !w.cols.is_multiple_of(bs) {
            return None;
        }
        let nb = w.cols / bs;
        let block_bytes = w.ty.row_bytes(bs)?;
        let mut lines = LineBuf::zeroed(w.rows / GROUP * nb * lines_per)?;
        // Groups are independent: packed on every core (a 7B model's 4.7 GB at load).
        let pack_group = |g: usize, glines: &mut [Line]| {
            for b in 0..nb {
                if k_quant {
                    let at = b * lines_per;
                    packed_k::pack_record(w, g, b, &mut glines[at..at + lines_per]);
                    continue;
                }
                let mut record = [0u8; 64 * MAX_LINES];
                let bytes = &mut record[..64 * lines_per];
                for r in 0..GROUP {
                    let blk = &w.row(g * GROUP + r)[b * block_bytes..][..block_bytes];
                    bytes[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
                    let quants = match w.ty {
                        WeightType::Q4_1 => {
                            bytes[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&blk[2..4]);
                            &blk[4..]
                        }
                        WeightType::Q5_0 if wide => {
                            let qh = u32::from_le_bytes(blk[2..6].try_into().expect("4 bytes"));
                            // Element e's byte where Q8_0 keeps it: line 1 + e / 4, lane r.
                            for e in 0..32 {
                                let nibble = if e < 16 {
                                    blk[6 + e] & 0x0F
                                } else {
                                    blk[6 + e - 16] >> 4
                                };
                                let high = ((qh >> e) & 1) as u8;
                                bytes[64 + (e / 4) * 64 + 4 * r + e % 4] = nibble | (high << 4);
                            }
                            continue;
                        }
                        WeightType::Q5_0 => {
                            let qh = u32::from_le_bytes(blk[2..6].try_into().expect("4 bytes"));
                            let at = Q5_0_HIGH_LINE * 64 + 4 * r;
                            bytes[at..at + 4].copy_from_slice(&q5_0_high_bits(qh).to_le_bytes());
                            &blk[6..]
                        }
                        _ => &blk[2..],
                    };
                    for (k, dw) in quants.chunks_exact(4).enumerate() {
                        let at = 64 + k * 64 + 4 * r;
                        for (o, &q) in bytes[at..at + 4].iter_mut().zip(dw) {
                            *o = if w.ty == WeightType::Q8_0 {
                                q ^ 0x80
                            } else {
                                q
                            };
                        }
                    }
                }
                let at = b * lines_per;
                for (line, src) in glines[at..at + lines_per]
                    .iter_mut()
                    .zip(bytes.chunks_exact(64))
                {
                    line.0.copy_from_slice(src);
                }
            }
        };
        lines
            .as_mut_slice()
            .par_chunks_mut(nb * lines_per)
            .enumerate()
            .for_each(|(g, glines)| pack_group(g, glines));
        Some(PackedRows {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            wide,
            lines,
        })
    }

    /// Whether Q5_0's elements are a byte each ([`Packing::Compute`]): only the 512-bit
    /// kernels read such a record.
    pub fn wide(&self) -> bool {
        self.wide
    }

    /// Lines per (group, block) record.
    pub(crate) fn record_lines(&self) -> usize {
        record_lines(self.ty, self.wide).expect("packed types have records")
    }

    /// Storage type of the source rows.
    pub fn ty(&self) -> WeightType {
        self.ty
    }

    /// Rows (a multiple of [`GROUP`]).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.lines.as_slice().len() * 64
    }

    /// Whether this is the packing of `w` (same type and shape).
    pub(crate) fn packs(&self, w: &QMatrix<'_>) -> bool {
        self.ty == w.ty && self.rows == w.rows && self.cols == w.cols
    }

    /// The record of group `g`, block `b`: `record_lines(ty)` lines.
    pub(crate) fn record(&self, g: usize, b: usize) -> *const u8 {
        let per = self.record_lines();
        let nb = self.cols / self.ty.block_size();
        self.lines.as_slice()[(g * nb + b) * per..].as_ptr() as *const u8
    }
}

// Prefetch requests. The kernels ask for lines themselves in two cases, and only there:
//
// - A one-token product walks a matrix record after record ([`prefetch_ahead`]). Whether the
//   hardware prefetchers keep up with that walk alone depends on the core
//   ([`prefetch_distance`]), measured with `examples/gemv_from_memory.rs`:
//   - Intel: the hardware prefetcher alone left it at about 70% of the stream rate from memory
//     (Q4_K at 7.7 GB/s beside an 11 GB/s plain sum on one core; 9-11 GB/s with requests 8 KiB
//     ahead).
//   - AMD Zen 3 and Zen 4: the prefetchers keep up on their own and the requests only take load
//     slots: on a Zen 4 (family 25 model 17) Q4_K read 24 GB/s without them and 17 GB/s with
//     them, Q8_0 30 against 25; on a Zen 3 Q6_K 11.1-11.7 without, 9.3-9.6 with.
//   - AMD Zen 5 (family 26 model 2): Q6_K, whose records take the longest to compute, fell
//     behind without them: on one core 18.5 GB/s without, 29-31 with requests 4 KiB ahead
//     (27-29 with 8 KiB, 22 with 32 KiB; every locality hint alike), beside a 37-40 GB/s plain
//     sum; Q8_0 30 against 35-38, Q4_K 31 either way; on two cores Q6_K 33.5 against 41.3. A
//     decode of Llama 3.2 1B's shapes (Q4_K_M) went from 30.2 to 35.1 tok/s on one thread.
// - A decode batch on AVX2 walks a group lane by lane, one line of each record at a time,
//   lines a few hundred bytes apart that no hardware prefetcher foresees
//   ([`PackedRows::prefetch_group`]): from memory (Gemma 3's output head, 178 MB, against a
//   batch of four on a Zen 3) a pass took as long as four one-token passes before the
//   requests. These are asked for on every vendor, by `packed_avx2.rs`, for batches of up to
//   sixteen tokens (prefill's chunks pass over a matrix once per tile of tokens, from cache
//   after the first, where the requests would only take slots).

/// How far ahead of the record being read [`prefetch_ahead`] asks for lines, in bytes, on
/// this CPU; `None` where the hardware prefetchers do without (see above). A group's records
/// lie one after another and the groups too, so this is the matrix's next few kilobytes.
#[cfg(target_arch = "x86_64")]
fn prefetch_distance() -> Option<usize> {
    static DISTANCE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *DISTANCE.get_or_init(|| {
        use std::arch::x86_64::__cpuid;
        // CPUID leaf 0: the vendor string in EBX, EDX, ECX ("Auth", "enti", "cAMD").
        let id = __cpuid(0);
        if [id.ebx, id.edx, id.ecx] != [0x6874_7541, 0x6974_6e65, 0x444d_4163] {
            return Some(8192);
        }
        // Leaf 1, EAX: base family in bits 8-11, extended family (added to 15) in 20-27.
        let eax = __cpuid(1).eax;
        let base = (eax >> 8) & 0xF;
        let family = if base == 0xF {
            base + ((eax >> 20) & 0xFF)
        } else {
            base
        };
        (family >= 0x1A).then_some(4096)
    })
}

/// Asks for `lines` consecutive lines from `at` into every cache level. Past the matrix's end
/// a prefetch does nothing (it never faults).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn request_lines(at: *const u8, lines: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for l in 0..lines {
        // SAFETY: a prefetch reads nothing the program sees and does not fault.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * l) as *const i8) };
    }
}

/// Asks for the `lines` lines [`prefetch_distance`] after `rec`, a record of `lines` lines: as
/// every record of a pass asks for its own distance ahead, the whole matrix is asked for once.
/// Nothing on a CPU whose prefetchers do without. `t0` is the first token of the caller's
/// pass over the group: only the pass from token 0 asks; the passes for the group's later
/// tokens find its records in cache, and requests there only take load slots (on the Zen 5
/// above, `prefill_matmul q4_k 8192 2048 512 1 15`, three runs each: 45.1-48.6 ms with
/// requests on every pass, 40.0-48.2 on the first only, 44.8-45.5 with none; the host's
/// noise is as large).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead(rec: *const u8, lines: usize, t0: usize) {
    if t0 != 0 {
        return;
    }
    if let Some(ahead) = prefetch_distance() {
        request_lines(rec.wrapping_add(ahead), lines);
    }
}

#[cfg(target_arch = "x86_64")]
impl PackedRows {
    /// Asks for every line of group `g`'s records (a decode batch's next group, see above).
    #[inline(always)]
    pub(crate) fn prefetch_group(&self, g: usize) {
        let per = self.record_lines();
        let nb = self.cols / self.ty.block_size();
        request_lines(self.record(g, 0), per * nb);
    }
}

/// The most lines a record of 32-element blocks takes (Q8_0's).
const MAX_LINES: usize = 9;

/// Lines per (group, block) record: one of scales (and Q4_1's minimums), then 64 bytes per
/// four quant bytes of a row (Q4_x and Q5_0: 16 bytes a row, Q8_0 and a `wide` Q5_0: 32), then
/// a compact Q5_0's high bits (four bytes a row).
pub(crate) fn record_lines(ty: WeightType, wide: bool) -> Option<usize> {
    match ty {
        WeightType::Q4_0 | WeightType::Q4_1 => Some(1 + 4),
        WeightType::Q5_0 if wide => Some(1 + 8),
        WeightType::Q5_0 => Some(1 + 4 + 1),
        WeightType::Q8_0 => Some(1 + 8),
        WeightType::Q4_K => Some(packed_k::Q4_K_LINES),
        WeightType::Q6_K => Some(packed_k::Q6_K_LINES),
        _ => None,
    }
}

/// The line of a Q5_0 record that holds the sixteen rows' high bits ([`q5_0_high_bits`]).
pub(crate) const Q5_0_HIGH_LINE: usize = 5;

/// Q5_0's high bits `qh` (bit `e` belongs to element `e`) rearranged so that bit `2j + h` of
/// byte `i` is element `16h + 4j + i`'s: the bits that quant line `j`'s low (`h = 0`) or high
/// (`h = 1`) nibbles need sit at one position in every byte, one shift and mask from bit 4.
pub(crate) fn q5_0_high_bits(qh: u32) -> u32 {
    let mut p = 0u32;
    for i in 0..4 {
        for j in 0..4 {
            for h in 0..2 {
                let bit = (qh >> (16 * h + 4 * j + i)) & 1;
                p |= bit << (8 * i + 2 * j + h);
            }
        }
    }
    p
}

/// One instruction set's kernel for a group of [`GROUP`] packed rows and one token.
pub(crate) type GroupKernel = unsafe fn(&PackedRows, usize, &QuantizedActs, usize) -> [f32; GROUP];

/// The same for two consecutive tokens (the same bits as two calls of the one-token kernel).
pub(crate) type GroupKernel2 =
    unsafe fn(&PackedRows, usize, &QuantizedActs, usize) -> [[f32; GROUP]; 2];

/// Rows `r0..r0 + n` of `w` through its packing, whole groups only, for every token, into
/// `out` (row `r - r0`, token `t`); returns how many rows it did (none unless `w` is packed and
/// `r0` starts a group). Tokens go through `pair` two at a time where there is one.
///
/// # Safety
/// The CPU must support what `kernel` and `pair` need.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run_groups(
    kernel: GroupKernel,
    pair: Option<GroupKernel2>,
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    a: &QuantizedActs,
    tokens: usize,
    mut out: Dest<'_>,
) -> usize {
    let Some(pk) = w
        .packed
        .filter(|p| r0.is_multiple_of(GROUP) && record_lines(p.ty(), p.wide()).is_some())
        .filter(|p| !matches!(p.ty(), WeightType::Q4_K | WeightType::Q6_K))
    else {
        return 0;
    };
    assert!(pk.packs(w), "packing of another matrix");
    assert_eq!(a.qs.len(), tokens * w.cols, "activation shape");
    assert_eq!(a.d.len(), tokens * a.blocks());
    let mut done = 0;
    while done + GROUP <= n {
        let g = (r0 + done) / GROUP;
        let mut t = 0;
        // SAFETY (both kernels): the caller vouches for the CPU; `pk` packs `w` (checked), so
        // group `g` exists, and the activations hold `tokens` rows (checked).
        if let Some(pair) = pair {
            while t + 2 <= tokens {
                // SAFETY: see above.
                let two = unsafe { pair(pk, g, a, t) };
                for (j, group) in two.iter().enumerate() {
                    out.put(done, t + j, group);
                }
                t += 2;
            }
        }
        for t in t..tokens {
            // SAFETY: see above.
            let group = unsafe { kernel(pk, g, a, t) };
            out.put(done, t, &group);
        }
        done += GROUP;
    }
    done
}
