//! The kernels of one SmolLM2-135M decode step (Q4_1 layers, Q8_0 output, random weights packed
//! as the model packs them at load, a context of CTX keys), run STEPS times on THREADS threads: a kernels-only harness that builds
//! in a minute and runs under `valgrind --tool=callgrind` (instruction counts per step are
//! `(total(STEPS) - total(0)) / STEPS`), for before/after comparisons on a noisy machine.
//! `cargo run --release -p pagewarden-kernels --example decode_profile -- THREADS STEPS CTX`
use half::f16;
use pagewarden_kernels::activation::swiglu;
use pagewarden_kernels::norm::rms_norm;
use pagewarden_kernels::quant::quantize_row;
use pagewarden_kernels::{matmul, matmul_many, paged_attention, AttnGeometry, KvBlock, Parallel};
use pagewarden_kernels::{PackedRows, QMatrix, WeightType};
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

fn mat(seed: &mut u64, ty: WeightType, rows: usize, cols: usize) -> Vec<u8> {
    let x = rnd(seed, cols);
    let row = quantize_row(ty, &x);
    let mut v = Vec::with_capacity(rows * row.len());
    for _ in 0..rows {
        v.extend_from_slice(&row);
    }
    v
}

/// The Q4_1 matrix `d` of shape `r x c`, through its packing.
fn m<'a>(d: &'a [u8], pk: &'a PackedRows, r: usize, c: usize) -> QMatrix<'a> {
    QMatrix::new(WeightType::Q4_1, r, c, d)
        .unwrap()
        .with_packed(pk)
}

fn pack(ty: WeightType, d: &[u8], r: usize, c: usize) -> PackedRows {
    PackedRows::pack(&QMatrix::new(ty, r, c, d).unwrap()).expect("packable")
}

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap())
        .collect();
    let (threads, steps, ctx) = (a[0], a[1], a[2]);
    let (dim, ffn, heads, kvh, hd, layers, vocab) = (576, 1536, 9, 3, 64, 30, 49152);
    let q41 = WeightType::Q4_1;
    let mut seed = 0x1234_5678_9abc_def1u64;
    let lw: Vec<[Vec<u8>; 7]> = (0..layers)
        .map(|_| {
            [
                mat(&mut seed, q41, dim, dim),
                mat(&mut seed, q41, kvh * hd, dim),
                mat(&mut seed, q41, kvh * hd, dim),
                mat(&mut seed, q41, dim, dim),
                mat(&mut seed, q41, ffn, dim),
                mat(&mut seed, q41, ffn, dim),
                mat(&mut seed, q41, dim, ffn),
            ]
        })
        .collect();
    let shapes = [
        (dim, dim),
        (kvh * hd, dim),
        (kvh * hd, dim),
        (dim, dim),
        (ffn, dim),
        (ffn, dim),
        (dim, ffn),
    ];
    let lp: Vec<Vec<PackedRows>> = lw
        .iter()
        .map(|w| {
            w.iter()
                .zip(shapes)
                .map(|(d, (r, c))| pack(q41, d, r, c))
                .collect()
        })
        .collect();
    let out_w = mat(&mut seed, WeightType::Q8_0, vocab, dim);
    let out_p = pack(WeightType::Q8_0, &out_w, vocab, dim);
    let page = 16;
    let pages = (ctx + 1).div_ceil(page);
    let kv: Vec<f16> = rnd(&mut seed, pages * page * kvh * hd)
        .iter()
        .map(|&v| f16::from_f32(v))
        .collect();
    let blocks: Vec<KvBlock<'_>> = (0..pages)
        .map(|p| {
            let s = &kv[p * page * kvh * hd..(p + 1) * page * kvh * hd];
            KvBlock { k: s, v: s }
        })
        .collect();
    let geo = AttnGeometry {
        heads,
        kv_heads: kvh,
        head_dim: hd,
        page_size: page,
        window: None,
        score_scale: None,
    };
    let norm_w = vec![1.0f32; dim];
    let par = Parallel::new(threads);
    let mut x = rnd(&mut seed, dim);
    let (mut xn, mut q, mut k, mut v) = (
        vec![0f32; dim],
        vec![0f32; dim],
        vec![0f32; kvh * hd],
        vec![0f32; kvh * hd],
    );
    let (mut att, mut proj, mut gate, mut up) = (
        vec![0f32; dim],
        vec![0f32; dim],
        vec![0f32; ffn],
        vec![0f32; ffn],
    );
    let mut logits = vec![0f32; vocab];
    let mut step = |x: &mut Vec<f32>| {
        for (w, p) in lw.iter().zip(&lp) {
            rms_norm(x, &norm_w, 1e-5, &mut xn);
            matmul_many(
                &[
                    m(&w[0], &p[0], dim, dim),
                    m(&w[1], &p[1], kvh * hd, dim),
                    m(&w[2], &p[2], kvh * hd, dim),
                ],
                &xn,
                1,
                &mut [&mut q, &mut k, &mut v],
                &par,
            );
            paged_attention(&geo, &q, 1, ctx, &blocks, &mut att, &par);
            matmul(&m(&w[3], &p[3], dim, dim), &att, 1, &mut proj, &par);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b * 1e-3);
            rms_norm(x, &norm_w, 1e-5, &mut xn);
            matmul_many(
                &[m(&w[4], &p[4], ffn, dim), m(&w[5], &p[5], ffn, dim)],
                &xn,
                1,
                &mut [&mut gate, &mut up],
                &par,
            );
            swiglu(&mut gate, &up);
            matmul(&m(&w[6], &p[6], dim, ffn), &gate, 1, &mut proj, &par);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b * 1e-3);
        }
        rms_norm(x, &norm_w, 1e-5, &mut xn);
        let ow = QMatrix::new(WeightType::Q8_0, vocab, dim, &out_w)
            .unwrap()
            .with_packed(&out_p);
        matmul(&ow, &xn, 1, &mut logits, &par);
        logits.iter().copied().fold(0f32, f32::max)
    };
    let mut sink = step(&mut x);
    let t = Instant::now();
    for _ in 0..steps {
        sink += step(&mut x);
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "threads {threads} ctx {ctx}: {:.3} ms/step, {:.1} steps/s ({sink})",
        s * 1e3 / steps as f64,
        steps as f64 / s
    );
}
