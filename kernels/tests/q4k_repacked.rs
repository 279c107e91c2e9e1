//! Q4_K matrices with a multiple of 8 rows take llama.cpp's repacked order
//! (`matmul/q4k_repacked.rs`): every ISA and thread count gives the portable bits, activation
//! rows in whole groups of four take the gemm order and the rest the gemv (decode) order.

mod common;

use common::{max_rel_err, Rng};
use pagewarden_kernels::matmul::q4k_repacked::Route;
use pagewarden_kernels::quant::dequantize_row;
use pagewarden_kernels::{matmul_with, Isa, Parallel, QMatrix, WeightType};

/// Q4_K super-blocks from random bytes with finite, modest f16 scales.
fn random_q4_k(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows * cols / 256 {
        let mut b: Vec<u8> = (0..144).map(|_| rng.next_u64() as u8).collect();
        b[0..2].copy_from_slice(&half::f16::from_f32(0.01 * rng.unit()).to_le_bytes());
        b[2..4].copy_from_slice(&half::f16::from_f32(0.01 * rng.unit().abs()).to_le_bytes());
        out.extend(b);
    }
    out
}

fn product(isa: Isa, w: &QMatrix<'_>, x: &[f32], tokens: usize, threads: usize) -> Vec<f32> {
    let mut out = vec![0f32; tokens * w.rows];
    matmul_with(isa, w, x, tokens, &mut out, &Parallel::new(threads));
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn route_is_gemm_for_whole_groups_of_four_then_gemv() {
    let routes = |n: usize| (0..n).map(|t| Route::of(t, n)).collect::<Vec<_>>();
    assert_eq!(routes(1), [Route::Gemv]);
    assert_eq!(routes(3), [Route::Gemv; 3]);
    assert_eq!(routes(4), [Route::Gemm; 4]);
    let six = routes(6);
    assert_eq!(six[..4], [Route::Gemm; 4]);
    assert_eq!(six[4..], [Route::Gemv; 2]);
}

/// Every ISA and thread count against the portable reference, for token counts that mix
/// both routes; the reference stays a faithful product of the dequantized weights.
#[test]
fn every_isa_is_bit_equal_to_portable() {
    let mut rng = Rng::new(41);
    for &(rows, cols) in &[(8, 256), (16, 512), (24, 1024), (64, 2048)] {
        let data = random_q4_k(&mut rng, rows, cols);
        let w = QMatrix::new(WeightType::Q4_K, rows, cols, &data).unwrap();
        for tokens in [1, 2, 3, 4, 5, 7, 8, 9, 17] {
            // Large activations too: the 16-bit pair sums reach their extremes.
            for scale in [1.0, 50.0] {
                let x = rng.vec(tokens * cols, scale);
                let reference = product(Isa::Portable, &w, &x, tokens, 1);
                let mut dense = vec![0f32; tokens * rows];
                let mut wf = vec![0f32; cols];
                for r in 0..rows {
                    dequantize_row(WeightType::Q4_K, w.row(r), &mut wf);
                    for t in 0..tokens {
                        let xr = &x[t * cols..(t + 1) * cols];
                        dense[t * rows + r] = wf.iter().zip(xr).map(|(a, b)| a * b).sum();
                    }
                }
                let e = max_rel_err(&reference, &dense);
                assert!(e < 3e-2, "{rows}x{cols}x{tokens}: reference vs dense {e}");
                for isa in Isa::available() {
                    for threads in [1, 3] {
                        let got = product(isa, &w, &x, tokens, threads);
                        assert_eq!(
                            bits(&got),
                            bits(&reference),
                            "{isa:?} t{threads} {rows}x{cols}x{tokens} scale {scale}"
                        );
                    }
                }
            }
        }
    }
}

/// A token's output depends on its route only: the last `tokens % 4` rows of a product have
/// the bits of one-token (decode) products, the first groups of four those of a four-token
/// product, and the two orders do differ somewhere (else the split would be untested).
#[test]
fn leftover_rows_take_the_decode_order_and_groups_the_gemm_order() {
    let mut rng = Rng::new(43);
    let (rows, cols, tokens) = (64, 2048, 6);
    let data = random_q4_k(&mut rng, rows, cols);
    let w = QMatrix::new(WeightType::Q4_K, rows, cols, &data).unwrap();
    let x = rng.vec(tokens * cols, 30.0);
    for isa in Isa::available() {
        let all = product(isa, &w, &x, tokens, 2);
        let four = product(isa, &w, &x[..4 * cols], 4, 2);
        assert_eq!(bits(&all[..4 * rows]), bits(&four), "{isa:?} gemm rows");
        let mut differs = 0;
        for t in 0..tokens {
            let one = product(isa, &w, &x[t * cols..(t + 1) * cols], 1, 1);
            let got = &all[t * rows..(t + 1) * rows];
            if t >= 4 {
                assert_eq!(bits(got), bits(&one), "{isa:?} gemv row {t}");
            } else {
                differs += got.iter().zip(&one).filter(|(a, b)| a != b).count();
            }
        }
        assert!(differs > 0, "{isa:?}: gemm and gemv orders never differ");
    }
}

/// Bits of llama.cpp's `ggml_mul_mat` (the 0.3.36 sdist's ggml, built with `GGML_NATIVE` on an
/// AVX-512 Zen 4), on inputs drawn from this file's generator (`random_q4_k`, then
/// `Rng::vec`): `(seed, rows, cols, tokens, scale, out[t * rows + r])`. The 16- and 8-row
/// matrices ran repacked (`CPU_REPACK`, q4_K_8x8: gemm for four rows, gemv for two; gemv for
/// one), the 12-row one through `ggml_vec_dot_q4_K_q8_K` (no whole blocks of 8 rows).
type Golden = (u64, usize, usize, usize, f32, &'static [u32]);
const GOLDEN: [Golden; 3] = [
    (
        41,
        16,
        512,
        6,
        30.0,
        &[
            0x4326543a, 0xc4bd408e, 0x44911c67, 0xc2b6179e, 0x4400e1f6, 0x43d40ac1, 0x45055ccd,
            0xc218c068, 0xc39fa4c4, 0xc41355b9, 0xc49fa318, 0xc319bd16, 0x4492f828, 0xc3f23d3e,
            0x43c6f120, 0xc4fc9463, 0x448c4d1f, 0xc4122df6, 0x44f43f1d, 0xc2e24c5c, 0x43189b06,
            0x44279fa2, 0xc39bb5ae, 0xc3735814, 0xc38ba213, 0xc4621ab5, 0xc51b08bd, 0x43a77cf4,
            0x44aafbd8, 0x43412160, 0x440625c0, 0xc44568c9, 0x4496ff42, 0xc42e75d6, 0x44e9908b,
            0xc2d5770a, 0x44711e55, 0x44575bee, 0x44dddfbe, 0xc1adf2f0, 0x44277066, 0xc3a00c7a,
            0xc443450c, 0xc37d9074, 0x44e163a7, 0xc401f511, 0x441fa1e4, 0x4405fdf4, 0xc401defc,
            0x442f7d4f, 0xc42f4fac, 0xc037ff70, 0x43a6c4e6, 0xc428f426, 0x438b30d2, 0x431fa9e0,
            0xc3ed4e6d, 0xc4293ee2, 0xc3e198c8, 0xc414322c, 0xc46010ad, 0x43632a21, 0xc211eb3d,
            0x44966809, 0xc2b0712d, 0xc4097da9, 0x43d069e0, 0x430eeba0, 0x42411ea0, 0xc1f90a76,
            0xc3a61f42, 0xc32e5140, 0xc36f3508, 0x43d75f71, 0x437af557, 0xc44bf27d, 0x430620ec,
            0xc2c28f2e, 0x43a5581b, 0x4410aef0, 0xc457fafc, 0x4439329e, 0xc3346049, 0x42b193fe,
            0xc4d61835, 0x42eb23d9, 0xc1aed7f0, 0xc2ba31c3, 0x441ff574, 0x433eba5b, 0x4200ef82,
            0xc50fc36c, 0xc35bb332, 0xc36f9950, 0xc350c5ce, 0x45283d91,
        ],
    ),
    (
        7,
        8,
        256,
        1,
        1.0,
        &[
            0xc11ddb07, 0xc1135e75, 0xc12b9372, 0xc0bdb334, 0xc0de1e42, 0xc116d3c7, 0xc0c2d590,
            0xbe45c8ce,
        ],
    ),
    (
        43,
        12,
        512,
        5,
        30.0,
        &[
            0x442f0fda, 0x435101dc, 0x43205f59, 0xc40790e5, 0xc4b625ef, 0x44801fa0, 0x447fc1e5,
            0xc4603b7e, 0xc379533a, 0xc4a91624, 0x438606bc, 0xc0fd68ac, 0xc4e965dc, 0xc41b54a1,
            0xc329fb64, 0xc3d223ed, 0xc48dd930, 0x43a0c8dc, 0x447fa904, 0x43a052e8, 0x43bbe86b,
            0x4428500a, 0x42e53fd6, 0xc31ccc9d, 0xc3dbdec2, 0x422f0c62, 0x43c4d4d3, 0xc29e913c,
            0xc421f01b, 0x44442a82, 0xc4868fd1, 0x44a9a4e7, 0x44948827, 0xc4cefb12, 0xc3dca9cb,
            0x43e7a050, 0xc4beb707, 0xc391daee, 0xc35af621, 0x43a823a2, 0x438d7357, 0xc4066410,
            0x448bf270, 0xc48a8d92, 0x432d9064, 0x4448cd3e, 0xc43a7f98, 0x429981b1, 0xc453662c,
            0x43aeb182, 0xc3a16793, 0x43acb326, 0x438e179c, 0x4412bcfc, 0x43099719, 0xc3b619e5,
            0xc2f267b3, 0xc4041adf, 0x4437735a, 0xc3326c1a,
        ],
    ),
];

#[test]
fn bits_equal_llama_cpp_on_golden_products() {
    for (seed, rows, cols, tokens, scale, want) in GOLDEN {
        let mut rng = Rng::new(seed);
        let data = random_q4_k(&mut rng, rows, cols);
        let w = QMatrix::new(WeightType::Q4_K, rows, cols, &data).unwrap();
        let x = rng.vec(tokens * cols, scale);
        for isa in Isa::available() {
            let got = product(isa, &w, &x, tokens, 2);
            assert_eq!(bits(&got), want, "{isa:?} {rows}x{cols}x{tokens}");
        }
    }
}
