//! Decode-shaped matrix-vector benchmarks (Q4_1, SmolLM2-135M sizes), GPU against the CPU
//! kernel, and the matmul-only time of one whole SmolLM2 decode step.

use std::time::Instant;

use anyhow::Result;
use half::f16;
use pagewarden_kernels::cuda::cudarc::driver::sys::CUevent_flags;
use pagewarden_kernels::cuda::{CudaBackend, DeviceMatrix};
use pagewarden_kernels::{matmul, Parallel, QMatrix, WeightType};

use crate::Rng;

/// Random Q4_1 bytes with sane scales (fast to make at model size; values are irrelevant here).
fn random_q4_1(rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut data: Vec<u8> = (0..rows * cols / 32 * 20)
        .map(|_| rng.next_u64() as u8)
        .collect();
    let (d, m) = (
        f16::from_f32(0.01).to_le_bytes(),
        f16::from_f32(-0.08).to_le_bytes(),
    );
    for b in data.chunks_exact_mut(20) {
        b[..2].copy_from_slice(&d);
        b[2..4].copy_from_slice(&m);
    }
    data
}

/// GPU microseconds per call of `f`, timed with CUDA events over `iters` back-to-back calls.
fn time_gpu(gpu: &CudaBackend, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..5 {
        f()?;
    }
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = gpu.stream().record_event(flags)?;
    for _ in 0..iters {
        f()?;
    }
    let end = gpu.stream().record_event(flags)?;
    Ok(start.elapsed_ms(&end)? as f64 * 1000.0 / iters as f64)
}

fn time_cpu(iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

/// The four decode-shaped products, batch 1 and 32.
pub fn matvec(gpu: &CudaBackend, par: &Parallel, rng: &mut Rng) -> Result<()> {
    println!(
        "\n{:<26} {:>5} {:>10} {:>9} {:>10} {:>8}",
        "Q4_1 matvec (in -> out)", "batch", "GPU us", "GPU GB/s", "CPU us", "CPU/GPU"
    );
    for (cols, rows) in [(576, 576), (576, 1536), (1536, 576), (576, 49152)] {
        let data = random_q4_1(rows, cols, rng);
        let w = QMatrix::new(WeightType::Q4_1, rows, cols, &data).expect("shape");
        let dw = gpu.upload_matrix(&w)?;
        for batch in [1usize, 32] {
            let x = rng.vec(batch * cols, 1.0);
            let dx = gpu.upload(&x)?;
            let mut dy = gpu.zeros::<f32>(batch * rows)?;
            let iters = if rows > 10_000 { 200 } else { 1000 };
            let us = time_gpu(gpu, iters, || Ok(gpu.matmul(&dw, &dx, batch, &mut dy)?))?;
            let bytes = data.len() + batch * (cols + rows) * 4;
            let gbs = bytes as f64 / (us * 1e-6) / 1e9;
            let mut y = vec![0f32; batch * rows];
            let cpu_iters = if rows > 10_000 { 3 } else { 20 };
            let cpu_us = time_cpu(cpu_iters, || matmul(&w, &x, batch, &mut y, par));
            println!(
                "{:<26} {:>5} {:>10.2} {:>9.0} {:>10.1} {:>8.1}",
                format!("{cols} -> {rows}"),
                batch,
                us,
                gbs,
                cpu_us,
                cpu_us / us
            );
        }
    }
    Ok(())
}

/// Every weight product of one SmolLM2-135M decode step (30 layers + output head).
pub fn decode_step(gpu: &CudaBackend, rng: &mut Rng) -> Result<()> {
    const DIM: usize = 576;
    const KV: usize = 192;
    const FFN: usize = 1536;
    const VOCAB: usize = 49152;
    const LAYERS: usize = 30;
    let per_layer = [
        (DIM, DIM),
        (DIM, KV),
        (DIM, KV),
        (DIM, DIM),
        (DIM, FFN),
        (DIM, FFN),
        (FFN, DIM),
    ];
    let mut mats: Vec<DeviceMatrix> = Vec::new();
    let mut bytes = 0usize;
    for _ in 0..LAYERS {
        for &(cols, rows) in &per_layer {
            let data = random_q4_1(rows, cols, rng);
            bytes += data.len();
            mats.push(gpu.upload_matrix(
                &QMatrix::new(WeightType::Q4_1, rows, cols, &data).expect("shape"),
            )?);
        }
    }
    let head = random_q4_1(VOCAB, DIM, rng);
    bytes += head.len();
    mats.push(
        gpu.upload_matrix(&QMatrix::new(WeightType::Q4_1, VOCAB, DIM, &head).expect("shape"))?,
    );
    println!(
        "\nSmolLM2-135M decode step, weight products only ({} matrices, {:.1} MB Q4_1):",
        mats.len(),
        bytes as f64 / 1e6
    );
    for batch in [1usize, 32] {
        let x = gpu.upload(&rng.vec(batch * FFN, 1.0))?;
        let mut y = gpu.zeros::<f32>(batch * VOCAB)?;
        let us = time_gpu(gpu, 50, || {
            for m in &mats {
                gpu.matmul(m, &x, batch, &mut y)?;
            }
            Ok(())
        })?;
        println!(
            "  batch {batch:>2}: {us:>8.1} us/step -> at most {:>7.0} tok/s per sequence, {:>8.0} tok/s total ({:.0} GB/s of weights)",
            1e6 / us,
            1e6 / us * batch as f64,
            bytes as f64 / (us * 1e-6) / 1e9
        );
    }
    Ok(())
}
