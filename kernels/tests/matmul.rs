//! Every SIMD matmul path against the portable reference, and the reference against a
//! dequantized f32 product, for every weight type and awkward shapes.

mod common;

use common::{max_rel_err, Rng};
use pagewarden_kernels::quant::{dequantize_row, quantize_row};
use pagewarden_kernels::{matmul_with, Isa, Parallel, QMatrix, WeightType};

const TYPES: [WeightType; 6] = [
    WeightType::F32,
    WeightType::F16,
    WeightType::Q4_0,
    WeightType::Q4_1,
    WeightType::Q5_0,
    WeightType::Q8_0,
];

const K_TYPES: [WeightType; 3] = [WeightType::Q4_K, WeightType::Q5_K, WeightType::Q6_K];

fn make(rng: &mut Rng, ty: WeightType, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows)
        .flat_map(|_| quantize_row(ty, &rng.vec(cols, 1.0)))
        .collect()
}

fn dense(w: &QMatrix<'_>, x: &[f32], tokens: usize) -> Vec<f32> {
    let mut wf = vec![0f32; w.cols];
    let mut out = vec![0f32; tokens * w.rows];
    for r in 0..w.rows {
        dequantize_row(w.ty, w.row(r), &mut wf);
        for t in 0..tokens {
            let xr = &x[t * w.cols..(t + 1) * w.cols];
            out[t * w.rows + r] = wf.iter().zip(xr).map(|(a, b)| a * b).sum();
        }
    }
    out
}

#[test]
fn simd_matches_portable_for_every_type_and_shape() {
    let mut rng = Rng::new(7);
    let shapes = [
        (1, 32, 1),
        (3, 64, 2),
        (17, 96, 5),
        (70, 576, 4),
        (9, 1536, 7),
        (130, 64, 9),
    ];
    for ty in TYPES {
        for &(rows, cols, tokens) in &shapes {
            let data = make(&mut rng, ty, rows, cols);
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            let x = rng.vec(tokens * cols, 2.0);
            let mut reference = vec![0f32; tokens * rows];
            matmul_with(
                Isa::Portable,
                &w,
                &x,
                tokens,
                &mut reference,
                &Parallel::single(),
            );
            // The reference itself is a faithful product (activation quantization error only).
            let exact = dense(&w, &x, tokens);
            let tol = if matches!(ty, WeightType::F32 | WeightType::F16) {
                1e-5
            } else {
                2e-2
            };
            let e = max_rel_err(&reference, &exact);
            assert!(
                e < tol,
                "{ty:?} {rows}x{cols}x{tokens}: reference vs dense err {e}"
            );
            for isa in Isa::available() {
                for threads in [1, 3] {
                    let mut got = vec![0f32; tokens * rows];
                    matmul_with(isa, &w, &x, tokens, &mut got, &Parallel::new(threads));
                    let e = max_rel_err(&got, &reference);
                    assert!(
                        e < 1e-5,
                        "{ty:?} {isa:?} t{threads} {rows}x{cols}x{tokens}: err {e}"
                    );
                }
            }
        }
    }
}

#[test]
fn zero_activations_and_zero_weights_give_zero() {
    for ty in TYPES {
        let data = quantize_row(ty, &[0.0; 64]);
        let w = QMatrix::new(ty, 1, 64, &data).unwrap();
        for isa in Isa::available() {
            let mut out = [1f32; 2];
            matmul_with(isa, &w, &[0.5; 128], 2, &mut out, &Parallel::single());
            assert_eq!(out, [0.0, 0.0], "{ty:?} {isa:?}");
        }
    }
}

#[test]
fn qmatrix_rejects_wrong_sizes() {
    assert!(QMatrix::new(WeightType::Q4_1, 2, 64, &[0u8; 79]).is_none());
    assert!(QMatrix::new(WeightType::Q4_0, 1, 33, &[0u8; 18]).is_none());
    assert!(QMatrix::new(WeightType::Q8_0, 2, 32, &[0u8; 68]).is_some());
}

#[test]
fn dequantize_matches_block_layout() {
    // Q4_0: d = 1.0, nibble j = j for low half, 15 - j for high half.
    let mut blk = half::f16::from_f32(1.0).to_le_bytes().to_vec();
    blk.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let mut out = [0f32; 32];
    dequantize_row(WeightType::Q4_0, &blk, &mut out);
    for j in 0..16 {
        assert_eq!(out[j], j as f32 - 8.0);
        assert_eq!(out[j + 16], (15 - j) as f32 - 8.0);
    }
    // Q4_1: d = 0.5, m = -1.
    let mut blk = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    blk.extend(half::f16::from_f32(-1.0).to_le_bytes());
    blk.extend((0..16u8).map(|j| j | (3 << 4)));
    dequantize_row(WeightType::Q4_1, &blk, &mut out);
    assert_eq!(out[5], 5.0 * 0.5 - 1.0);
    assert_eq!(out[20], 3.0 * 0.5 - 1.0);
}

#[test]
fn matmul_many_equals_separate_products_bit_for_bit() {
    use pagewarden_kernels::matmul_many_with;
    let mut rng = Rng::new(21);
    let cols = 96;
    // Mixed types and row counts that do not divide the chunk size.
    let specs = [
        (WeightType::Q4_1, 70),
        (WeightType::Q8_0, 9),
        (WeightType::F16, 33),
    ];
    let data: Vec<Vec<u8>> = specs
        .iter()
        .map(|&(ty, rows)| make(&mut rng, ty, rows, cols))
        .collect();
    let ws: Vec<QMatrix<'_>> = specs
        .iter()
        .zip(&data)
        .map(|(&(ty, rows), d)| QMatrix::new(ty, rows, cols, d).unwrap())
        .collect();
    for isa in Isa::available() {
        for threads in [1, 2] {
            for tokens in [1, 5] {
                let x = rng.vec(tokens * cols, 2.0);
                let par = Parallel::new(threads);
                let mut outs: Vec<Vec<f32>> =
                    ws.iter().map(|w| vec![f32::NAN; tokens * w.rows]).collect();
                let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                matmul_many_with(isa, &ws, &x, tokens, &mut refs, &par);
                for (w, got) in ws.iter().zip(&outs) {
                    let mut want = vec![0f32; tokens * w.rows];
                    matmul_with(isa, w, &x, tokens, &mut want, &par);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{isa:?} {:?} threads {threads} tokens {tokens}", w.ty);
                }
            }
        }
    }
}

/// The SIMD paths differ only in how the exact integer products are formed (`maddubs` +
/// `madd` or VNNI's `vpdpbusd`), and keep ggml's per-block float order: same bits.
#[test]
fn simd_paths_agree_bit_for_bit_on_quantized_weights() {
    let mut rng = Rng::new(5);
    let simd: Vec<Isa> = Isa::available()
        .into_iter()
        .filter(|i| *i != Isa::Portable)
        .collect();
    for ty in [
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q8_0,
    ] {
        for &(rows, cols, tokens) in &[(33, 576, 1), (20, 1536, 3), (9, 64, 6)] {
            let data = make(&mut rng, ty, rows, cols);
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            // Large activations: the block products reach the i16 pair sums' extremes.
            let x = rng.vec(tokens * cols, 50.0);
            let outs: Vec<Vec<f32>> = simd
                .iter()
                .map(|&isa| {
                    let mut o = vec![0f32; tokens * rows];
                    matmul_with(isa, &w, &x, tokens, &mut o, &Parallel::new(2));
                    o
                })
                .collect();
            for (isa, o) in simd.iter().zip(&outs).skip(1) {
                let same = o
                    .iter()
                    .zip(&outs[0])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{ty:?} {rows}x{cols}x{tokens}: {isa:?} != {:?}",
                    simd[0]
                );
            }
        }
    }
}

/// K-quant super-blocks from random bytes (every byte pattern is a valid block) with finite,
/// modest f16 scales, so that all packed scale, minimum and high-bit combinations occur.
fn random_k_blocks(rng: &mut Rng, ty: WeightType, rows: usize, cols: usize) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut out = Vec::new();
    for _ in 0..rows * cols / 256 {
        let mut b: Vec<u8> = (0..bb).map(|_| rng.next_u64() as u8).collect();
        let mut put = |at: usize, v: f32| {
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        };
        match ty {
            WeightType::Q6_K => put(208, 0.01 * rng.unit()),
            _ => {
                put(0, 0.01 * rng.unit());
                put(2, 0.01 * rng.unit().abs());
            }
        }
        out.extend(b);
    }
    out
}

/// The K-quant products: the reference is a faithful product of the dequantized weights (Q8_K
/// activation rounding only), and every ISA and thread count gives the reference's bits (the
/// integer lanes are exact and the floats follow one shared order, ggml's eight lanes).
#[test]
fn k_quants_match_dense_and_every_isa_is_bit_equal_to_portable() {
    let mut rng = Rng::new(31);
    for ty in K_TYPES {
        for &(rows, cols, tokens) in &[(1, 256, 1), (17, 512, 3), (70, 1024, 5), (9, 2048, 9)] {
            let data = random_k_blocks(&mut rng, ty, rows, cols);
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            // Large activations too: the 16-bit pair sums reach their extremes.
            for scale in [1.0, 50.0] {
                let x = rng.vec(tokens * cols, scale);
                let mut reference = vec![0f32; tokens * rows];
                let par = Parallel::single();
                matmul_with(Isa::Portable, &w, &x, tokens, &mut reference, &par);
                let e = max_rel_err(&reference, &dense(&w, &x, tokens));
                assert!(
                    e < 3e-2,
                    "{ty:?} {rows}x{cols}x{tokens}: reference vs dense err {e}"
                );
                for isa in Isa::available() {
                    for threads in [1, 3] {
                        let mut got = vec![0f32; tokens * rows];
                        matmul_with(isa, &w, &x, tokens, &mut got, &Parallel::new(threads));
                        let same = got
                            .iter()
                            .zip(&reference)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{ty:?} {isa:?} t{threads} {rows}x{cols}x{tokens}");
                    }
                }
            }
        }
    }
}

/// Dequantization follows ggml's layouts: hand-built super-blocks with known values.
#[test]
fn k_quant_dequantize_matches_block_layout() {
    use half::f16;
    // Q4_K: d = 1, dmin = 0.5; sub-block 0 scale 2 min 3, sub-block 5 (packed in the high
    // bits) scale 33 min 17; every nibble byte 0x21 (low 1, high 2).
    let mut b = vec![0u8; 144];
    b[0..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
    b[2..4].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    let q = &mut b[4..16];
    q[0] = 2;
    q[4] = 3;
    // j = 5: scale = (q[9] & 0xF) | (q[1] >> 6) << 4, min = (q[9] >> 4) | (q[5] >> 6) << 4.
    q[9] = (1 << 4) | 1;
    q[1] = 0b10 << 6;
    q[5] = 0b01 << 6;
    b[16..].fill(0x21);
    let mut out = vec![0f32; 256];
    dequantize_row(WeightType::Q4_K, &b, &mut out);
    assert_eq!(out[0], 2.0 * 1.0 - 0.5 * 3.0);
    // Element 160 is the first of sub-block 5 (high nibbles of bytes 64..96): q = 2.
    assert_eq!(out[160], 33.0 * 2.0 - 0.5 * 17.0);
    // Q6_K: d = 0.25, scale of the second 16 elements -3; element 16 = low nibble of ql[16]
    // with the low two bits of qh[16]: (5 | 2 << 4) - 32 = 5.
    let mut b = vec![0u8; 210];
    b[208..210].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
    b[193] = (-3i8) as u8;
    b[16] = 5;
    b[128 + 16] = 2;
    dequantize_row(WeightType::Q6_K, &b, &mut out);
    assert_eq!(out[16], 0.25 * -3.0 * 5.0);
    // Q5_0 round-trips ggml's quantizer within half a step.
    let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
    let data = quantize_row(WeightType::Q5_0, &x);
    let mut back = [0f32; 32];
    dequantize_row(WeightType::Q5_0, &data, &mut back);
    for (a, b) in x.iter().zip(back) {
        assert!((a - b).abs() <= 0.51, "{a} vs {b}");
    }
}

#[test]
fn activation_quantization_is_the_same_on_every_isa_and_thread_count() {
    use pagewarden_kernels::act::quantize_acts_with;
    let mut rng = Rng::new(23);
    let (rows, cols) = (37, 96);
    let mut x = rng.vec(rows * cols, 3.0);
    // An all-zero block, exact halves (ties round to even) and a block at one scale.
    x[32..64].fill(0.0);
    for (i, v) in x[64..96].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 0.5;
    }
    let want = quantize_acts_with(Isa::Portable, &x, rows, cols, &Parallel::single());
    for isa in Isa::available() {
        for threads in [1, 2] {
            let got = quantize_acts_with(isa, &x, rows, cols, &Parallel::new(threads));
            assert_eq!(got.qs, want.qs, "{isa:?} x{threads}: values");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got.d), bits(&want.d), "{isa:?} x{threads}: scales");
            assert_eq!(bits(&got.s), bits(&want.s), "{isa:?} x{threads}: sums");
        }
    }
}

/// Q8_K activations on every instruction set, split over threads by rows (ragged last task),
/// are the portable code's values of each row alone: with blocks of zeros, ties, a largest
/// magnitude that comes twice with both signs, infinities and NaNs, and a largest magnitude
/// so small that the scale overflows.
#[test]
fn k_activation_quantization_is_the_same_on_every_isa_and_thread_count() {
    use pagewarden_kernels::act_k::{quantize_acts_k_with, QuantizedActsK};
    let mut rng = Rng::new(24);
    let (rows, cols) = (37, 512);
    let mut x = rng.vec(rows * cols, 3.0);
    x[256..512].fill(0.0);
    // Row 2: halves of the scale's steps (ties), the largest magnitude first negative, then
    // positive.
    for (i, v) in x[2 * cols..2 * cols + 256].iter_mut().enumerate() {
        *v = (i as f32 - 128.0) / 2.0;
    }
    x[2 * cols + 7] = -64.0;
    x[2 * cols + 9] = 64.0;
    // Row 3: an infinity and a NaN in one block, a NaN alone in the next.
    x[3 * cols + 5] = f32::INFINITY;
    x[3 * cols + 6] = f32::NAN;
    x[3 * cols + 300] = f32::NAN;
    // Row 4: subnormal values (the scale -127 / max is infinite) and one below 127 / f32::MAX.
    for (i, v) in x[4 * cols..4 * cols + 256].iter_mut().enumerate() {
        *v = f32::from_bits(1 + i as u32) * if i % 3 == 0 { -1.0 } else { 1.0 };
    }
    x[4 * cols + 256..5 * cols].fill(1e-37);
    x[4 * cols + 300] = -2e-37;
    let mut want = QuantizedActsK::default();
    for row in x.chunks_exact(cols) {
        let q = quantize_acts_k_with(Isa::Portable, row, 1, cols, &Parallel::single());
        want.qs.extend(q.qs);
        want.d.extend(q.d);
        want.bsums.extend(q.bsums);
    }
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for isa in Isa::available() {
        for threads in [1, 2, 3] {
            let got = quantize_acts_k_with(isa, &x, rows, cols, &Parallel::new(threads));
            assert_eq!(got.qs, want.qs, "{isa:?} x{threads}: values");
            assert_eq!(bits(&got.d), bits(&want.d), "{isa:?} x{threads}: scales");
            assert_eq!(got.bsums, want.bsums, "{isa:?} x{threads}: sums");
        }
    }
}

/// The interleaved packing changes only where the bytes sit: on every instruction set, a
/// matrix with its packing gives the same bits as the plain rows on AVX2 (ggml's kernel), for
/// one token and for tiles of several, alone and beside unpacked weights in one pass. Where the
/// CPU has AVX-512, this runs the 16-row kernel; on AVX2, the half-group kernels (one token, or
/// a lane at a time for up to eight: `packed_avx2.rs`). Packed for compute (Q5_0 widened for
/// the 512-bit kernels, which the AVX2 kernels leave to the plain rows), the same bits again.
#[test]
fn packed_rows_give_the_bits_of_plain_rows_on_every_isa() {
    use pagewarden_kernels::{matmul_many_with, PackedRows, Packing};
    let mut rng = Rng::new(33);
    for ty in [
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q8_0,
    ] {
        // Token counts that take every tile of the several-token kernels (AVX2: 8, 4, 2, 1).
        for &(rows, cols, tokens) in &[
            (16, 576, 1),
            (48, 1536, 1),
            (64, 576, 5),
            (160, 64, 3),
            (32, 640, 15),
            (16, 64, 2),
        ] {
            for packing in [Packing::Bandwidth, Packing::Compute] {
                let data = make(&mut rng, ty, rows, cols);
                let w = QMatrix::new(ty, rows, cols, &data).unwrap();
                let pk = PackedRows::pack_as(Isa::detect(), &w, packing)
                    .expect("whole groups of a packable type");
                let wide = Isa::detect() == Isa::Avx512
                    && ty == WeightType::Q5_0
                    && packing == Packing::Compute;
                assert_eq!(pk.wide(), wide, "{ty:?} {packing:?}");
                assert_eq!(pk.bytes() % 64, 0);
                let packed = w.with_packed(&pk);
                // Large activations: every activation byte reaches +-127.
                let x = rng.vec(tokens * cols, 50.0);
                let mut want = vec![0f32; tokens * rows];
                matmul_with(Isa::Avx2, &w, &x, tokens, &mut want, &Parallel::new(1));
                let other = make(&mut rng, WeightType::Q4_1, 20, cols);
                let other = QMatrix::new(WeightType::Q4_1, 20, cols, &other).unwrap();
                for isa in Isa::available().into_iter().filter(|i| *i != Isa::Portable) {
                    for threads in [1, 2] {
                        let par = Parallel::new(threads);
                        let mut got = vec![f32::NAN; tokens * rows];
                        let mut beside = vec![f32::NAN; tokens * 20];
                        matmul_many_with(
                            isa,
                            &[packed, other],
                            &x,
                            tokens,
                            &mut [&mut got, &mut beside],
                            &par,
                        );
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{ty:?} {packing:?} {rows}x{cols}x{tokens} {isa:?} t{threads}"
                        );
                        let mut alone = vec![0f32; tokens * 20];
                        matmul_with(Isa::Avx2, &other, &x, tokens, &mut alone, &par);
                        assert_eq!(beside, alone, "{ty:?} {isa:?}: the unpacked neighbour");
                    }
                }
            }
        }
    }
}

/// Q4_K and Q6_K packed at load (`packed_k.rs`) give the portable reference's bits on every
/// instruction set (the 16-row kernels where the CPU has AVX-512, the eight-row ones of
/// `packed_k_avx2.rs` on AVX2; the portable code reads the rows): Q4_K in llama.cpp's repacked order for token counts that mix its gemm and gemv
/// rows, Q6_K in ggml's eight-lane order; beside a matrix whose rows are not whole groups.
#[test]
fn packed_k_quants_give_the_portable_bits_on_every_isa() {
    use pagewarden_kernels::{matmul_many_with, PackedRows};
    let mut rng = Rng::new(35);
    for ty in [WeightType::Q4_K, WeightType::Q6_K] {
        for &(rows, cols) in &[(16, 256), (48, 1024), (64, 2048)] {
            let data = random_k_blocks(&mut rng, ty, rows, cols);
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            let pk = PackedRows::pack_for(Isa::Avx512, &w).expect("whole groups");
            let packed = w.with_packed(&pk);
            let odd = random_k_blocks(&mut rng, ty, 24, cols);
            let odd = QMatrix::new(ty, 24, cols, &odd).unwrap();
            assert!(PackedRows::pack_for(Isa::Avx512, &odd).is_none());
            for tokens in [1, 2, 3, 4, 5, 7, 9] {
                for scale in [1.0, 50.0] {
                    let x = rng.vec(tokens * cols, scale);
                    let one = Parallel::single();
                    let mut want = vec![0f32; tokens * rows];
                    matmul_with(Isa::Portable, &w, &x, tokens, &mut want, &one);
                    let mut want_odd = vec![0f32; tokens * 24];
                    matmul_with(Isa::Portable, &odd, &x, tokens, &mut want_odd, &one);
                    for isa in Isa::available() {
                        for threads in [1, 2] {
                            let mut got = vec![f32::NAN; tokens * rows];
                            let mut got_odd = vec![f32::NAN; tokens * 24];
                            matmul_many_with(
                                isa,
                                &[packed, odd],
                                &x,
                                tokens,
                                &mut [&mut got, &mut got_odd],
                                &Parallel::new(threads),
                            );
                            let same = |a: &[f32], b: &[f32]| {
                                a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
                            };
                            let at = format!("{ty:?} {rows}x{cols}x{tokens} {isa:?} t{threads}");
                            assert!(same(&got, &want), "{at}");
                            assert!(same(&got_odd, &want_odd), "{at}: the unpacked neighbour");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn only_whole_groups_of_packable_types_are_packed() {
    use pagewarden_kernels::PackedRows;
    let mut rng = Rng::new(34);
    let q = make(&mut rng, WeightType::Q4_1, 24, 64);
    assert!(PackedRows::pack(&QMatrix::new(WeightType::Q4_1, 24, 64, &q).unwrap()).is_none());
    // Q4_K and Q6_K are packed for the AVX2 and 512-bit kernels, and Q5_K not at all.
    for ty in [WeightType::Q4_K, WeightType::Q6_K] {
        let k = random_k_blocks(&mut rng, ty, 16, 256);
        let k = QMatrix::new(ty, 16, 256, &k).unwrap();
        assert!(PackedRows::pack_for(Isa::Portable, &k).is_none());
        assert!(PackedRows::pack_for(Isa::Avx2, &k).is_some());
        assert!(PackedRows::pack_for(Isa::Avx512, &k).is_some());
    }
    let k5 = random_k_blocks(&mut rng, WeightType::Q5_K, 16, 256);
    let k5 = QMatrix::new(WeightType::Q5_K, 16, 256, &k5).unwrap();
    assert!(PackedRows::pack_for(Isa::Avx512, &k5).is_none());
    let f = make(&mut rng, WeightType::F16, 16, 64);
    assert!(PackedRows::pack(&QMatrix::new(WeightType::F16, 16, 64, &f).unwrap()).is_none());
}

/// From `kquant_tiled::MIN_TOKENS` activation rows on, Q5_K / Q6_K products (and Q4_K ones
/// llama.cpp does not repack) take llama.cpp's tiled float order, below it `vec_dot`'s, on
/// every ISA and packed or not; the two orders differ on some element of these shapes, so
/// each assertion can fail.
#[test]
fn k_quants_take_the_tiled_order_from_eight_rows() {
    use pagewarden_kernels::act_k::quantize_acts_k;
    use pagewarden_kernels::matmul::kquant_portable::{dot_q45_k, dot_q6_k};
    use pagewarden_kernels::matmul::kquant_tiled::{self, MIN_TOKENS};
    use pagewarden_kernels::matmul::packed::PackedRows;
    let mut rng = Rng::new(0x7173);
    // Q4_K with 36 rows (not a multiple of 8): llama.cpp does not repack it.
    for (ty, rows) in [
        (WeightType::Q6_K, 32),
        (WeightType::Q5_K, 32),
        (WeightType::Q4_K, 36),
    ] {
        let cols = 1024;
        let data = random_k_blocks(&mut rng, ty, rows, cols);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let packed = PackedRows::pack(&w);
        let mut orders_differ = false;
        // llama.cpp's `ggml_tiled_min_batch`: `rows >= 8`.
        assert_eq!(MIN_TOKENS, 8);
        for tokens in [7, 8, 11] {
            let x = rng.vec(tokens * cols, 3.0);
            let a = quantize_acts_k(&x, tokens, cols);
            let want: Vec<f32> = (0..tokens * rows)
                .map(|i| {
                    let (t, r) = (i / rows, i % rows);
                    let row = w.row(r);
                    let vec_dot = match ty {
                        WeightType::Q6_K => dot_q6_k(row, &a, t),
                        _ => dot_q45_k(ty == WeightType::Q5_K, row, &a, t),
                    };
                    let tiled = kquant_tiled::dot(ty, row, &a, t);
                    orders_differ |= vec_dot.to_bits() != tiled.to_bits();
                    if kquant_tiled::applies(&w, tokens) {
                        tiled
                    } else {
                        vec_dot
                    }
                })
                .collect();
            assert_eq!(kquant_tiled::applies(&w, tokens), tokens >= 8);
            for isa in Isa::available() {
                for wm in [Some(w), packed.as_ref().map(|p| w.with_packed(p))]
                    .into_iter()
                    .flatten()
                {
                    let mut got = vec![0f32; tokens * rows];
                    matmul_with(isa, &wm, &x, tokens, &mut got, &Parallel::new(2));
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(g, w)| g.to_bits() == w.to_bits());
                    assert!(
                        same,
                        "{ty:?} {isa:?} tokens {tokens} packed {}",
                        wm.packed.is_some()
                    );
                }
            }
        }
        assert!(orders_differ, "{ty:?}: the two orders never differed");
    }
}
