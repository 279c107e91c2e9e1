//! Times one quantized product of prefill's shape (`ROWS x COLS` weights, packed as the model
//! packs them at load, against `TOKENS` activation rows) on `THREADS` threads, `REPS` times,
//! and prints the median and the multiply-adds per second: a kernels-only harness for
//! before/after comparisons of one weight type's prefill kernel.
//! `cargo run --release -p pagewarden-kernels --example prefill_matmul -- TYPE ROWS COLS TOKENS THREADS REPS`
//! (TYPE: q4_0, q4_1, q5_0, q8_0, q4_k, q6_k).
use pagewarden_kernels::quant::quantize_row;
use pagewarden_kernels::{matmul, Isa, PackedRows, Packing, Parallel, QMatrix, WeightType};
use std::time::Instant;

fn rnd(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// Random rows: quantized floats, or for a K-quant random bytes with small scales.
fn rows(seed: &mut u64, ty: WeightType, rows: usize, cols: usize) -> Vec<u8> {
    if matches!(ty, WeightType::Q4_K | WeightType::Q6_K) {
        let bb = ty.block_bytes();
        let mut out = Vec::with_capacity(rows * cols / 256 * bb);
        for _ in 0..rows * cols / 256 {
            let mut b: Vec<u8> = rnd(seed, bb).iter().map(|v| (v * 512.0) as u8).collect();
            let at = if ty == WeightType::Q6_K { 208 } else { 0 };
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            if ty == WeightType::Q4_K {
                b[2..4].copy_from_slice(&half::f16::from_f32(0.005).to_le_bytes());
            }
            out.extend(b);
        }
        return out;
    }
    (0..rows)
        .flat_map(|_| quantize_row(ty, &rnd(seed, cols)))
        .collect()
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let ty = match a[0].as_str() {
        "q4_0" => WeightType::Q4_0,
        "q4_1" => WeightType::Q4_1,
        "q5_0" => WeightType::Q5_0,
        "q8_0" => WeightType::Q8_0,
        "q4_k" => WeightType::Q4_K,
        "q6_k" => WeightType::Q6_K,
        other => panic!("unknown type {other}"),
    };
    let n: Vec<usize> = a[1..].iter().map(|s| s.parse().unwrap()).collect();
    let (r, c, tokens, threads, reps) = (n[0], n[1], n[2], n[3], n[4]);
    let mut seed = 0x1234_5678_9abc_def1u64;
    let data = rows(&mut seed, ty, r, c);
    let plain = QMatrix::new(ty, r, c, &data).expect("shape");
    // UNPACKED=1: the rows as stored (the kernels for a matrix the loader did not pack);
    // COMPUTE=1: packed as a prefill worker packs them (`Packing::Compute`).
    let packing = match std::env::var_os("COMPUTE") {
        Some(_) => Packing::Compute,
        None => Packing::Bandwidth,
    };
    let pk = match std::env::var_os("UNPACKED") {
        Some(_) => None,
        None => PackedRows::pack_as(Isa::detect(), &plain, packing),
    };
    let w = match &pk {
        Some(p) => plain.with_packed(p),
        None => plain,
    };
    let x = rnd(&mut seed, tokens * c);
    let mut out = vec![0f32; tokens * r];
    let par = Parallel::new(threads);
    matmul(&w, &x, tokens, &mut out, &par);
    let mut ms: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            matmul(&w, &x, tokens, &mut out, &par);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    let med = ms[ms.len() / 2];
    let gmacs = (r * c * tokens) as f64 / (med * 1e-3) / 1e9;
    println!(
        "{ty:?} {r}x{c} x {tokens} tokens, {threads} threads, packed {}: median {med:.3} ms \
         (min {:.3}, max {:.3}), {gmacs:.1} GMAC/s; checksum {:.4}",
        pk.is_some(),
        ms[0],
        ms[ms.len() - 1],
        out.iter().map(|v| *v as f64).sum::<f64>()
    );
}
