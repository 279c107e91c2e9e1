//! Paged attention against a naive dense causal GQA attention (with and without a sliding
//! window).

mod common;

use common::{max_rel_err, Rng};
use half::f16;
use pagewarden_kernels::attention::{paged_attention_decode_many_with, paged_attention_with};
use pagewarden_kernels::attention_flash::flash_attention;
use pagewarden_kernels::{AttnGeometry, DecodeQuery, Isa, KvBlock, Parallel};

/// Dense reference: k, v are [tokens][kv_heads*hd] f32 (already f16-rounded).
fn naive(geo: &AttnGeometry, q: &[f32], n: usize, first: usize, k: &[f32], v: &[f32]) -> Vec<f32> {
    let (hd, tw) = (geo.head_dim, geo.token_width());
    let group = geo.heads / geo.kv_heads;
    let mut out = vec![0f32; n * geo.heads * hd];
    for i in 0..n {
        for h in 0..geo.heads {
            let g = h / group;
            let qv = &q[(i * geo.heads + h) * hd..][..hd];
            let keys = first + i + 1;
            let lo = geo.window.map_or(0, |w| keys.saturating_sub(w));
            let s: Vec<f64> = (0..keys)
                .map(|j| {
                    if j < lo {
                        return f64::NEG_INFINITY;
                    }
                    let kr = &k[j * tw + g * hd..][..hd];
                    qv.iter().zip(kr).map(|(a, b)| (a * b) as f64).sum::<f64>() / (hd as f64).sqrt()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                let acc: f64 = (0..keys)
                    .map(|j| e[j] / z * v[j * tw + g * hd + d] as f64)
                    .sum();
                out[(i * geo.heads + h) * hd + d] = acc as f32;
            }
        }
    }
    out
}

#[test]
fn paged_matches_dense_for_prefill_chunks_and_decode() {
    let mut rng = Rng::new(11);
    for geo in [
        AttnGeometry {
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            page_size: 4,
            window: None,
            score_scale: None,
        },
        AttnGeometry {
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            page_size: 16,
            window: None,
            score_scale: None,
        },
        AttnGeometry {
            heads: 2,
            kv_heads: 2,
            head_dim: 8,
            page_size: 1,
            window: None,
            score_scale: None,
        },
        // Gemma 3's local layers: one kv head, a sliding window shorter than the context.
        AttnGeometry {
            heads: 4,
            kv_heads: 1,
            head_dim: 32,
            page_size: 16,
            window: Some(50),
            score_scale: None,
        },
        // Gemma 3's head size, a group of three, a window inside one 64-key tile.
        AttnGeometry {
            heads: 6,
            kv_heads: 2,
            head_dim: 128,
            page_size: 16,
            window: Some(40),
            score_scale: None,
        },
    ] {
        let tw = geo.token_width();
        // 300 and 611: decode runs over several score tasks (256 keys each) and ragged chunks;
        // (70, 20): prefill over more than one 64-key run; (250, 37) and (0, 70): more than
        // one 256-key V tile, query blocks that straddle 16-key lanes, ragged row blocks.
        // (900, 33) and (1000, 1): the windowed layers skip most keys, in whole lanes.
        for (first, n) in [
            (900, 33),
            (1000, 1),
            (250, 37),
            (0, 70),
            (0usize, 1usize),
            (0, 7),
            (70, 20),
            (5, 1),
            (3, 40),
            (37, 1),
            (300, 1),
            (611, 1),
        ] {
            let total = first + n;
            let pages = total.div_ceil(geo.page_size) + 1; // one spare page, unused
            let kf = rng.vec(pages * geo.page_size * tw, 1.0);
            let vf = rng.vec(pages * geo.page_size * tw, 1.0);
            let kh: Vec<f16> = kf.iter().map(|x| f16::from_f32(*x)).collect();
            let vh: Vec<f16> = vf.iter().map(|x| f16::from_f32(*x)).collect();
            let kr: Vec<f32> = kh.iter().map(|x| x.to_f32()).collect();
            let vr: Vec<f32> = vh.iter().map(|x| x.to_f32()).collect();
            let pe = geo.page_size * tw;
            let blocks: Vec<KvBlock<'_>> = (0..pages)
                .map(|p| KvBlock {
                    k: &kh[p * pe..(p + 1) * pe],
                    v: &vh[p * pe..(p + 1) * pe],
                })
                .collect();
            let q = rng.vec(n * geo.heads * geo.head_dim, 2.0);
            let want = naive(&geo, &q, n, first, &kr, &vr);
            let mut portable = vec![0f32; q.len()];
            paged_attention_with(
                Isa::Portable,
                &geo,
                &q,
                n,
                first,
                &blocks,
                &mut portable,
                &Parallel::single(),
            );
            for isa in Isa::available() {
                for threads in [1, 2] {
                    let mut got = vec![0f32; q.len()];
                    let par = Parallel::new(threads);
                    paged_attention_with(isa, &geo, &q, n, first, &blocks, &mut got, &par);
                    let e = max_rel_err(&got, &want);
                    // q and the softmax probabilities are rounded to f16 like llama.cpp's
                    // attention (for parity), so the f32 naive reference differs by ~f16 epsilon.
                    assert!(e < 2e-3, "{geo:?} first={first} n={n} {isa:?}: err {e}");
                    // Every path computes ggml's operations in ggml's order: same bits.
                    let same = got
                        .iter()
                        .zip(&portable)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{geo:?} first={first} n={n} {isa:?} x{threads} differs from portable"
                    );
                }
            }
        }
    }
}

/// A decode step's attention for several sequences at once (one parallel pass over all of
/// them) gives each sequence the bits of its own one-token attention, with contexts of one
/// score task and of several (their softmax a pass of its own), with and without a window.
#[test]
fn decode_of_a_batch_gives_each_sequence_its_own_bits() {
    let mut rng = Rng::new(23);
    for window in [None, Some(40), Some(300)] {
        let geo = AttnGeometry {
            heads: 6,
            kv_heads: 2,
            head_dim: 64,
            page_size: 16,
            window,
            score_scale: None,
        };
        let (tw, qw) = (geo.token_width(), geo.heads * geo.head_dim);
        let pe = geo.page_size * tw;
        let keys = [1usize, 6, 300, 17, 611, 1000, 256, 257];
        let kv: Vec<(Vec<f16>, Vec<f16>)> = keys
            .iter()
            .map(|&k| {
                let n = k.div_ceil(geo.page_size) * pe;
                let to_f16 = |v: Vec<f32>| v.iter().map(|x| f16::from_f32(*x)).collect();
                (to_f16(rng.vec(n, 1.0)), to_f16(rng.vec(n, 1.0)))
            })
            .collect();
        let blocks: Vec<Vec<KvBlock<'_>>> = kv
            .iter()
            .map(|(k, v)| {
                k.chunks_exact(pe)
                    .zip(v.chunks_exact(pe))
                    .map(|(k, v)| KvBlock { k, v })
                    .collect()
            })
            .collect();
        let q = rng.vec(keys.len() * qw, 2.0);
        for isa in Isa::available() {
            for threads in [1, 2] {
                let par = Parallel::new(threads);
                let mut alone = vec![0f32; q.len()];
                for (i, &k) in keys.iter().enumerate() {
                    let r = i * qw..(i + 1) * qw;
                    paged_attention_with(
                        isa,
                        &geo,
                        &q[r.clone()],
                        1,
                        k - 1,
                        &blocks[i],
                        &mut alone[r],
                        &par,
                    );
                }
                let mut together = vec![0f32; q.len()];
                let mut queries: Vec<DecodeQuery<'_, '_>> = together
                    .chunks_exact_mut(qw)
                    .enumerate()
                    .map(|(i, out)| DecodeQuery {
                        q: &q[i * qw..(i + 1) * qw],
                        keys: keys[i],
                        blocks: &blocks[i],
                        out,
                    })
                    .collect();
                paged_attention_decode_many_with(isa, &geo, &mut queries, &par);
                for (i, k) in keys.iter().enumerate() {
                    let r = i * qw..(i + 1) * qw;
                    let same = together[r.clone()]
                        .iter()
                        .zip(&alone[r])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{window:?} {isa:?} x{threads}: sequence {i} ({k} keys) differs"
                    );
                }
            }
        }
    }
}

/// llama.cpp's flash-attention arithmetic (f16 value accumulation) against the dense
/// reference: the same attention within f16 accumulation error, the window and the causal
/// mask kept (keys outside them changed, the output is not), the same bits on 1 and 2 threads.
#[test]
fn flash_attention_matches_dense_within_f16_accumulation() {
    let mut rng = Rng::new(23);
    // Gemma 3's head (256: the half-precision vector path) and a narrow one (64: the
    // single-precision leftovers), with and without a window.
    for geo in [
        AttnGeometry {
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            page_size: 16,
            window: Some(30),
            score_scale: None,
        },
        AttnGeometry {
            heads: 6,
            kv_heads: 2,
            head_dim: 64,
            page_size: 8,
            window: None,
            score_scale: None,
        },
    ] {
        let tw = geo.token_width();
        for (first, n) in [(0usize, 9usize), (40, 1), (17, 5)] {
            let total = first + n;
            let pages = total.div_ceil(geo.page_size) + 1;
            let mut kh: Vec<f16> = rng
                .vec(pages * geo.page_size * tw, 1.0)
                .iter()
                .map(|x| f16::from_f32(*x))
                .collect();
            let vh: Vec<f16> = rng
                .vec(pages * geo.page_size * tw, 1.0)
                .iter()
                .map(|x| f16::from_f32(*x))
                .collect();
            // Keys past the last query's position are never seen: garbage there changes nothing.
            for x in &mut kh[total * tw..] {
                *x = f16::from_f32(1e4);
            }
            let kr: Vec<f32> = kh.iter().map(|x| x.to_f32()).collect();
            let vr: Vec<f32> = vh.iter().map(|x| x.to_f32()).collect();
            let pe = geo.page_size * tw;
            let blocks: Vec<KvBlock<'_>> = (0..pages)
                .map(|p| KvBlock {
                    k: &kh[p * pe..(p + 1) * pe],
                    v: &vh[p * pe..(p + 1) * pe],
                })
                .collect();
            // q pre-rounded to f16, as the kernel rounds it, so the reference sees the same q.
            let q: Vec<f32> = rng
                .vec(n * geo.heads * geo.head_dim, 2.0)
                .iter()
                .map(|x| f16::from_f32(*x).to_f32())
                .collect();
            let want = naive(&geo, &q, n, first, &kr, &vr);
            let scale = 1.0 / (geo.head_dim as f32).sqrt();
            let mut one = vec![0f32; q.len()];
            flash_attention(
                &geo,
                &q,
                n,
                first,
                &blocks,
                &mut one,
                scale,
                &Parallel::single(),
            );
            let e = max_rel_err(&one, &want);
            assert!(e < 5e-3, "{geo:?} first={first} n={n}: err {e}");
            let mut two = vec![0f32; q.len()];
            flash_attention(
                &geo,
                &q,
                n,
                first,
                &blocks,
                &mut two,
                scale,
                &Parallel::new(2),
            );
            assert!(
                one.iter()
                    .zip(&two)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{geo:?} first={first} n={n}: threads change the bits"
            );
        }
    }
}

#[test]
#[should_panic(expected = "need more than")]
fn too_few_pages_is_refused() {
    let geo = AttnGeometry {
        heads: 2,
        kv_heads: 1,
        head_dim: 8,
        page_size: 4,
        window: None,
        score_scale: None,
    };
    let k = vec![f16::ZERO; 32];
    let blocks = [KvBlock { k: &k, v: &k }];
    let mut out = vec![0f32; 16];
    paged_attention_with(
        Isa::Portable,
        &geo,
        &[0.0; 16],
        1,
        4,
        &blocks,
        &mut out,
        &Parallel::single(),
    );
}
