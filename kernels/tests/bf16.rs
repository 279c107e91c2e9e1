//! BF16 weights: the layout (the top half of an f32, rounded to nearest even), llama.cpp's
//! product (activations rounded to bf16 before the dot), and every instruction set giving the
//! portable bits.

mod common;

use common::Rng;
use half::bf16;
use pagewarden_kernels::matmul::bf16::dot_bf16;
use pagewarden_kernels::quant::{dequantize_row, quantize_row};
use pagewarden_kernels::{matmul_many_with, matmul_with, Isa, Parallel, QMatrix, WeightType};

#[test]
fn bf16_rows_round_to_nearest_even_and_decode_exactly() {
    let one_ulp = 2f32.powi(-7);
    // 1 + half an ulp ties to even (1.0); 1 + 1.5 ulp ties to even (1 + 2 ulp).
    let x = [1.0, 1.0 + one_ulp / 2.0, 1.0 + 1.5 * one_ulp, -3.5, 0.0];
    let row = quantize_row(WeightType::BF16, &x);
    assert_eq!(row.len(), 2 * x.len());
    assert_eq!(&row[..2], &0x3F80u16.to_le_bytes());
    let mut back = [0f32; 5];
    dequantize_row(WeightType::BF16, &row, &mut back);
    assert_eq!(back, [1.0, 1.0, 1.0 + 2.0 * one_ulp, -3.5, 0.0]);
}

#[test]
fn bf16_product_rounds_activations_as_llama_cpp() {
    // One weight of 1.0 and an activation bf16 cannot hold: llama.cpp multiplies by the
    // activation rounded to bf16 (1.0), not by its f32 value.
    let w = quantize_row(WeightType::BF16, &[1.0; 8]);
    let mut x = [0f32; 8];
    x[3] = 1.0 + 2f32.powi(-9);
    assert_eq!(dot_bf16(&w, &x), 1.0);
    let m = QMatrix::new(WeightType::BF16, 1, 8, &w).unwrap();
    for isa in Isa::available() {
        let mut out = [0f32; 1];
        matmul_with(isa, &m, &x, 1, &mut out, &Parallel::new(1));
        assert_eq!(out[0], 1.0, "{isa:?}");
    }
}

#[test]
fn bf16_matmul_is_the_dense_product_and_the_same_bits_on_every_isa() {
    let mut rng = Rng::new(7);
    let par = Parallel::new(3);
    for (rows, cols, tokens) in [(5, 8, 1), (37, 72, 3), (64, 100, 7)] {
        let data: Vec<u8> = (0..rows)
            .flat_map(|_| quantize_row(WeightType::BF16, &rng.vec(cols, 1.0)))
            .collect();
        let w = QMatrix::new(WeightType::BF16, rows, cols, &data).unwrap();
        let x = rng.vec(tokens * cols, 1.0);
        let mut want = vec![0f32; tokens * rows];
        matmul_with(Isa::Portable, &w, &x, tokens, &mut want, &par);
        let mut wf = vec![0f32; cols];
        for r in 0..rows {
            dequantize_row(WeightType::BF16, w.row(r), &mut wf);
            for t in 0..tokens {
                let exact: f64 = wf
                    .iter()
                    .zip(&x[t * cols..][..cols])
                    .map(|(a, b)| *a as f64 * bf16::from_f32(*b).to_f32() as f64)
                    .sum();
                let got = want[t * rows + r] as f64;
                assert!(
                    (got - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
                    "{rows}x{cols} t{t} r{r}: {got} vs {exact}"
                );
            }
        }
        for isa in Isa::available() {
            let mut got = vec![0f32; tokens * rows];
            matmul_many_with(isa, &[w], &x, tokens, &mut [&mut got], &par);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{isa:?} {rows}x{cols}x{tokens}"
            );
        }
    }
}
