//! One-token products (decode's GEMV) from memory, not cache: quantized weights of Llama 3.2
//! 1B's and Gemma 3 270M's shapes, random bytes with sane scales, packed as the model packs
//! them at load, several copies walked in turn as decode walks its layers; a kernels-only
//! timer for before/after comparisons (prints ms per product and the weights' GB/s).
//! `cargo run --release -p pagewarden-kernels --example gemv_from_memory -- THREADS REPS`
use pagewarden_kernels::{matmul, PackedRows, Parallel, QMatrix, WeightType};
use std::time::Instant;

fn bytes(seed: &mut u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 32) as u8
        })
        .collect()
}

/// A random matrix whose f16 scales are small and finite.
fn matrix(seed: &mut u64, ty: WeightType, rows: usize, cols: usize) -> Vec<u8> {
    let mut d = bytes(seed, rows * ty.row_bytes(cols).unwrap());
    let block = ty.row_bytes(ty.block_size()).unwrap();
    let scale = half::f16::from_f32(0.001).to_le_bytes();
    for b in d.chunks_exact_mut(block) {
        match ty {
            WeightType::Q4_K | WeightType::Q4_1 => {
                b[0..2].copy_from_slice(&scale);
                b[2..4].copy_from_slice(&scale);
            }
            WeightType::Q6_K => b[block - 2..].copy_from_slice(&scale),
            _ => b[0..2].copy_from_slice(&scale),
        }
    }
    d
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("THREADS REPS"))
        .collect();
    let (threads, reps) = (
        args.first().copied().unwrap_or(1),
        args.get(1).copied().unwrap_or(50),
    );
    let par = Parallel::new(threads);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    // Llama 3.2 1B: attention q (2048), ffn gate (8192), ffn_down in Q6_K, the tied head;
    // Gemma 3 270M's Q8_0 head and Q5_0 ffn gate; SmolLM2-135M's Q4_1 ffn gate.
    let shapes = [
        ("q4_k 2048x2048", WeightType::Q4_K, 2048, 2048),
        ("q4_k 8192x2048", WeightType::Q4_K, 8192, 2048),
        ("q6_k 2048x8192", WeightType::Q6_K, 2048, 8192),
        ("q6_k 128256x2048", WeightType::Q6_K, 128_256, 2048),
        ("q8_0 262144x640", WeightType::Q8_0, 262_144, 640),
        ("q5_0 2048x640", WeightType::Q5_0, 2048, 640),
        ("q4_1 1536x576", WeightType::Q4_1, 1536, 576),
    ];
    for (name, ty, rows, cols) in shapes {
        // Copies enough to pass any last-level cache, walked in turn, as decode walks layers.
        let size = ty.row_bytes(cols).unwrap() * rows;
        let copies = (400_000_000 / size).max(1);
        let datas: Vec<Vec<u8>> = (0..copies)
            .map(|_| matrix(&mut seed, ty, rows, cols))
            .collect();
        let plains: Vec<QMatrix> = datas
            .iter()
            .map(|d| QMatrix::new(ty, rows, cols, d).unwrap())
            .collect();
        let packs: Vec<Option<PackedRows>> = plains.iter().map(PackedRows::pack).collect();
        let ws: Vec<QMatrix> = plains
            .iter()
            .zip(&packs)
            .map(|(w, p)| match p {
                Some(p) => w.with_packed(p),
                None => *w,
            })
            .collect();
        let x: Vec<f32> = bytes(&mut seed, cols)
            .iter()
            .map(|&b| b as f32 / 128.0 - 1.0)
            .collect();
        let mut out = vec![0f32; rows];
        matmul(&ws[0], &x, 1, &mut out, &par);
        let mut times = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            for i in 0..reps {
                matmul(&ws[i % copies], &x, 1, &mut out, &par);
            }
            times.push(t.elapsed().as_secs_f64() / reps as f64);
        }
        times.sort_by(f64::total_cmp);
        let s = times[2];
        println!(
            "{name:18} packed={:5} {:8.3} ms  {:6.1} GB/s (weights {:.1} MB)",
            packs[0].is_some(),
            s * 1e3,
            size as f64 / s / 1e9,
            size as f64 / 1e6
        );
    }
}
