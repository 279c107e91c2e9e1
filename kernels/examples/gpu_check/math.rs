//! Dense kernels on random inputs: GPU against the CPU reference kernels (and, for matrix
//! products, against an exact f64 product of the dequantized weights, since the CPU quantizes
//! activations to 8 bits and the GPU keeps them f32).

use anyhow::Result;
use pagewarden_kernels::activation::{geglu, gelu_table, softmax, swiglu};
use pagewarden_kernels::cuda::CudaBackend;
use pagewarden_kernels::norm::rms_norm;
use pagewarden_kernels::quant::{dequantize_row, quantize_row};
use pagewarden_kernels::rope::Rope;
use pagewarden_kernels::{matmul, Parallel, QMatrix, WeightType};

use crate::report::{compare, verdict, Row};
use crate::Rng;

pub const TYPES: [WeightType; 10] = [
    WeightType::Q4_0,
    WeightType::Q4_1,
    WeightType::Q5_0,
    WeightType::Q8_0,
    WeightType::Q4_K,
    WeightType::Q5_K,
    WeightType::Q6_K,
    WeightType::F16,
    WeightType::BF16,
    WeightType::F32,
];

/// Random weights quantized with the crate's own quantizer.
pub fn weights(ty: WeightType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut data = Vec::with_capacity(rows * ty.row_bytes(cols).expect("cols"));
    for _ in 0..rows {
        data.extend(quantize_row(ty, &rng.vec(cols, 1.0)));
    }
    data
}

/// f64 product of the dequantized weights with f32 activations.
pub fn exact_matmul(w: &QMatrix<'_>, x: &[f32], tokens: usize) -> Vec<f32> {
    let mut row = vec![0f32; w.cols];
    let mut out = vec![0f32; tokens * w.rows];
    for r in 0..w.rows {
        dequantize_row(w.ty, w.row(r), &mut row);
        for t in 0..tokens {
            let xr = &x[t * w.cols..][..w.cols];
            let s: f64 = row.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
            out[t * w.rows + r] = s as f32;
        }
    }
    out
}

/// Tolerance of the GPU against the CPU kernel. The CPU quantizes activations to 8 bits, which
/// alone puts it about 4.5e-3 (max rel) from the exact product on these shapes (measured).
fn cpu_tol(ty: WeightType) -> f32 {
    match ty {
        WeightType::F32 | WeightType::F16 => 1e-5,
        WeightType::Q4_0
        | WeightType::Q4_1
        | WeightType::Q5_0
        | WeightType::Q8_0
        | WeightType::Q4_K
        | WeightType::Q5_K
        | WeightType::Q6_K
        | WeightType::BF16 => 1e-2,
    }
}

pub fn matmuls(
    gpu: &CudaBackend,
    par: &Parallel,
    rng: &mut Rng,
    rows_out: &mut Vec<Row>,
) -> Result<()> {
    // (rows, cols, tokens): decode and prefill shapes of SmolLM2, a ragged batch, and (dense
    // only) a row length that is not a multiple of 16.
    let shapes = [
        (576, 576, 1),
        (1536, 576, 8),
        (576, 1536, 32),
        (300, 576, 13),
        (100, 100, 3),
    ];
    for ty in TYPES {
        for &(rows, cols, tokens) in &shapes {
            if ty.row_bytes(cols).is_none() {
                continue;
            }
            let data = weights(ty, rows, cols, rng);
            let w = QMatrix::new(ty, rows, cols, &data).expect("shape");
            let x = rng.vec(tokens * cols, 1.0);
            let dw = gpu.upload_matrix(&w)?;
            let dx = gpu.upload(&x)?;
            let mut dy = gpu.zeros::<f32>(tokens * rows)?;
            gpu.matmul(&dw, &dx, tokens, &mut dy)?;
            let y = gpu.download(&dy)?;
            let shape = format!("{rows}x{cols} b{tokens}");
            let name = format!("matmul {ty:?}");
            rows_out.push(compare(
                &format!("{name} vs f64"),
                shape.clone(),
                &y,
                &exact_matmul(&w, &x, tokens),
                1e-4,
            ));
            let mut cpu = vec![0f32; tokens * rows];
            matmul(&w, &x, tokens, &mut cpu, par);
            rows_out.push(compare(
                &format!("{name} vs CPU"),
                shape.clone(),
                &y,
                &cpu,
                cpu_tol(ty),
            ));
            if dw.takes_q8_acts() {
                // The integer kernel over the CPU's 8-bit activations: the CPU's function, up
                // to the order of the blocks' sum.
                let mut acts = gpu.q8_acts(tokens * cols)?;
                gpu.quantize_q8(&dx, tokens * cols, &mut acts)?;
                gpu.matmul_q8(&dw, &acts, tokens, &mut dy)?;
                rows_out.push(compare(
                    &format!("matmul_q8 {ty:?} vs CPU"),
                    shape,
                    &gpu.download(&dy)?,
                    &cpu,
                    1e-5,
                ));
            }
        }
        // Embedding rows: exact dequantization (K-quant rows are whole 256-element blocks).
        let (rows, cols) = (64, if ty.block_size() == 256 { 1536 } else { 576 });
        let data = weights(ty, rows, cols, rng);
        let w = QMatrix::new(ty, rows, cols, &data).expect("shape");
        let ids = [5u32, 0, 63, 5, 17];
        let dw = gpu.upload_matrix(&w)?;
        let mut out = gpu.zeros::<f32>(ids.len() * cols)?;
        gpu.get_rows(&dw, &ids, &mut out)?;
        let got = gpu.download(&out)?;
        let mut want = vec![0f32; ids.len() * cols];
        for (i, &id) in ids.iter().enumerate() {
            dequantize_row(ty, w.row(id as usize), &mut want[i * cols..(i + 1) * cols]);
        }
        let same = got == want;
        rows_out.push(verdict(
            &format!("get_rows {ty:?}"),
            format!("{rows}x{cols} ids5"),
            same,
            String::new(),
        ));
    }
    Ok(())
}

pub fn elementwise(gpu: &CudaBackend, rng: &mut Rng, rows_out: &mut Vec<Row>) -> Result<()> {
    // RMSNorm.
    for (rows, dim) in [(1, 576), (32, 576), (4, 1536)] {
        let x = rng.vec(rows * dim, 3.0);
        let w = rng.vec(dim, 1.0);
        let mut cpu = vec![0f32; rows * dim];
        rms_norm(&x, &w, 1e-5, &mut cpu);
        let (dx, dw) = (gpu.upload(&x)?, gpu.upload(&w)?);
        let mut dy = gpu.zeros::<f32>(rows * dim)?;
        gpu.rms_norm(&dx, &dw, 1e-5, rows, &mut dy)?;
        rows_out.push(compare(
            "rms_norm",
            format!("{rows}x{dim}"),
            &gpu.download(&dy)?,
            &cpu,
            1e-5,
        ));
    }
    // Softmax over vocabulary-sized rows.
    for (rows, cols) in [(1, 49152), (8, 1000)] {
        let x = rng.vec(rows * cols, 10.0);
        let mut cpu = x.clone();
        cpu.chunks_exact_mut(cols).for_each(softmax);
        let mut dx = gpu.upload(&x)?;
        gpu.softmax(&mut dx, rows, cols)?;
        rows_out.push(compare(
            "softmax",
            format!("{rows}x{cols}"),
            &gpu.download(&dx)?,
            &cpu,
            1e-5,
        ));
    }
    // RoPE from per-row angles (SmolLM2: 9 heads of 64, base 1e5; a partial rotation; Llama 3's
    // scaled angles) at positions up to the context length, normal and NeoX pairs.
    for (heads, head_dim, n_dims, base, scale) in [
        (9usize, 64usize, 64usize, 100_000f32, 1.0f32),
        (3, 64, 32, 10_000.0, 1.0),
        (8, 64, 64, 500_000.0, 0.25),
    ] {
        let rope = Rope {
            base,
            n_dims,
            head_dim,
        };
        let tokens = 24;
        let pos: Vec<usize> = (0..tokens)
            .map(|i| {
                if i < 8 {
                    i
                } else {
                    (rng.next_u64() % 8192) as usize
                }
            })
            .collect();
        let table: Vec<Vec<(f32, f32)>> = pos
            .iter()
            .map(|&p| rope.cos_sin_scaled(p, scale, None))
            .collect();
        let flat: Vec<f32> = table.iter().flatten().flat_map(|&(c, s)| [c, s]).collect();
        let x = rng.vec(tokens * heads * head_dim, 2.0);
        for neox in [false, true] {
            let mut cpu = x.clone();
            for (row, cs) in cpu.chunks_exact_mut(heads * head_dim).zip(&table) {
                if neox {
                    rope.apply_neox_with(row, cs);
                } else {
                    rope.apply_with(row, cs);
                }
            }
            let mut dx = gpu.upload(&x)?;
            gpu.rope_rows(&rope, &gpu.upload(&flat)?, tokens, neox, &mut dx, heads)?;
            let shape = format!("{tokens}x{heads}x{head_dim} nd{n_dims} scale {scale}");
            // The CPU's angles and fused multiply-adds: the same bits.
            let same = gpu.download(&dx)? == cpu;
            let name = if neox { "rope (neox)" } else { "rope (norm)" };
            rows_out.push(verdict(name, shape, same, String::new()));
        }
    }
    // GeGLU through the CPU's f16 GELU table: the same bits.
    let n = 32 * 1536;
    let (g, u) = (rng.vec(n, 12.0), rng.vec(n, 2.0));
    let mut cpu = g.clone();
    geglu(&mut cpu, &u);
    let (mut dg, du) = (gpu.upload(&g)?, gpu.upload(&u)?);
    gpu.geglu(&mut dg, &du, &gpu.upload(&gelu_table()[..])?, n)?;
    let same = gpu.download(&dg)? == cpu;
    rows_out.push(verdict("geglu", format!("{n}"), same, String::new()));
    // Scaling, bias rows, soft-capping (the device's tanhf: close, not the same bits).
    let mut dx = gpu.upload(&g)?;
    gpu.scale(&mut dx, 0.125, n)?;
    let cpu: Vec<f32> = g.iter().map(|v| v * 0.125).collect();
    rows_out.push(verdict(
        "scale",
        format!("{n}"),
        gpu.download(&dx)? == cpu,
        String::new(),
    ));
    let bias = rng.vec(1536, 1.0);
    let mut dx = gpu.upload(&g)?;
    gpu.add_rows(&mut dx, &gpu.upload(&bias)?, n)?;
    let cpu: Vec<f32> = g
        .iter()
        .enumerate()
        .map(|(i, v)| v + bias[i % 1536])
        .collect();
    rows_out.push(verdict(
        "add_rows",
        format!("{n}"),
        gpu.download(&dx)? == cpu,
        String::new(),
    ));
    let mut dx = gpu.upload(&g)?;
    gpu.softcap(&mut dx, 30.0, n)?;
    let cpu: Vec<f32> = g.iter().map(|v| (v * (1.0 / 30.0)).tanh() * 30.0).collect();
    rows_out.push(compare(
        "softcap",
        format!("{n}"),
        &gpu.download(&dx)?,
        &cpu,
        1e-6,
    ));
    // SwiGLU and residual add.
    let n = 32 * 1536;
    let (g, u) = (rng.vec(n, 6.0), rng.vec(n, 2.0));
    let mut cpu = g.clone();
    swiglu(&mut cpu, &u);
    let (mut dg, du) = (gpu.upload(&g)?, gpu.upload(&u)?);
    gpu.swiglu(&mut dg, &du, n)?;
    // The CPU's exp, operation for operation: the same bits.
    let same = gpu.download(&dg)? == cpu;
    rows_out.push(verdict("swiglu", format!("{n}"), same, String::new()));
    // The CPU's activation quantization, bit for bit: what a quantized weight row meets.
    let acts = pagewarden_kernels::act::quantize_acts(&g, 32, n / 32);
    let mut dq = gpu.q8_acts(n)?;
    gpu.quantize_q8(&gpu.upload(&g)?, n, &mut dq)?;
    let same = gpu.download(&dq.qs)? == acts.qs
        && gpu.download(&dq.d)? == acts.d
        && gpu.download(&dq.s)? == acts.s;
    rows_out.push(verdict(
        "quantize_q8 (qs, d, s)",
        format!("{n}"),
        same,
        String::new(),
    ));
    let cpu: Vec<f32> = g.iter().zip(&u).map(|(a, b)| a + b).collect();
    let mut da = gpu.upload(&g)?;
    gpu.add(&mut da, &du, n)?;
    rows_out.push(compare(
        "add",
        format!("{n}"),
        &gpu.download(&da)?,
        &cpu,
        1e-6,
    ));
    Ok(())
}
