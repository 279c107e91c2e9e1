//! Times one prefill chunk's attention (`TOKENS` query tokens after `FIRST` cached ones, a
//! paged f16 cache of 16-token pages) on `THREADS` threads, `REPS` times, and prints the
//! fastest and median time and the multiply-adds per second (scores and weighted sum): a
//! kernels-only harness for before/after comparisons of prefill attention.
//! `cargo run --release -p pagewarden-kernels --example prefill_attention -- HEADS KV_HEADS HEAD_DIM WINDOW FIRST TOKENS THREADS REPS`
//! (WINDOW 0: every layer global; Gemma 3 270M: 4 1 256 512 for its local layers).
use half::f16;
use pagewarden_kernels::{paged_attention, AttnGeometry, KvBlock, Parallel};
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

fn main() {
    let n: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| {
            s.parse()
                .expect("eight numbers: HEADS KV_HEADS HEAD_DIM WINDOW FIRST TOKENS THREADS REPS")
        })
        .collect();
    let [heads, kv_heads, head_dim, window, first, tokens, threads, reps] = n[..] else {
        panic!("eight numbers: HEADS KV_HEADS HEAD_DIM WINDOW FIRST TOKENS THREADS REPS");
    };
    let geo = AttnGeometry {
        heads,
        kv_heads,
        head_dim,
        page_size: 16,
        window: (window > 0).then_some(window),
        score_scale: None,
    };
    let mut seed = 0x1234_5678_9abc_def1u64;
    let ctx = first + tokens;
    let pages = ctx.div_ceil(geo.page_size);
    let cache = |seed: &mut u64| -> Vec<f16> {
        rnd(seed, pages * geo.page_size * geo.token_width())
            .into_iter()
            .map(f16::from_f32)
            .collect()
    };
    let (k, v) = (cache(&mut seed), cache(&mut seed));
    let pe = geo.page_size * geo.token_width();
    let blocks: Vec<KvBlock<'_>> = (0..pages)
        .map(|p| KvBlock {
            k: &k[p * pe..(p + 1) * pe],
            v: &v[p * pe..(p + 1) * pe],
        })
        .collect();
    let q = rnd(&mut seed, tokens * heads * head_dim);
    let mut out = vec![0f32; q.len()];
    let par = Parallel::new(threads);
    paged_attention(&geo, &q, tokens, first, &blocks, &mut out, &par);
    let mut ms: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            paged_attention(&geo, &q, tokens, first, &blocks, &mut out, &par);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    // Keys each query token sees, times two products (scores, weighted sum) per head.
    let keys: usize = (first..ctx)
        .map(|p| match geo.window {
            Some(w) => (p + 1).min(w),
            None => p + 1,
        })
        .sum();
    let macs = (keys * heads * head_dim * 2) as f64;
    let sum: f64 = out.iter().map(|x| *x as f64).sum();
    println!(
        "attention heads {heads}/{kv_heads} x {head_dim}, window {window}, {tokens} tokens after {first}, {threads} thread(s): fastest {:.3} ms, median {:.3} ms, {:.1} GMAC/s at the median (checksum {sum:.6})",
        ms[0],
        ms[ms.len() / 2],
        macs / ms[ms.len() / 2] / 1e6
    );
}
