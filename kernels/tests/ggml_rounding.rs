//! The kernels round like llama.cpp's CPU backend: golden bit patterns taken from llama.cpp
//! (AVX-512 build, the reference machine) where a plain implementation differs by an ulp.

mod common;

use common::Rng;
use pagewarden_kernels::activation::{geglu, geglu_with, silu, softmax_with, swiglu, swiglu_with};
use pagewarden_kernels::expf::{expf, reduce16};
use pagewarden_kernels::isa::Isa;
use pagewarden_kernels::norm::rms_norm_with;
use pagewarden_kernels::rope::Rope;

fn f(bits: u32) -> f32 {
    f32::from_bits(bits)
}

#[test]
fn expf_matches_ggml_bits_where_libm_differs() {
    // (x, ggml_v_expf(x)); libm's expf is one or two ulps away on each.
    for (x, want, libm) in [
        (0x3ef21b5c, 0x3fcd6307, 0x3fcd6308),
        (0xc163bce4, 0x3530b58c, 0x3530b58b),
        (0xc0f0db12, 0x3a0d296f, 0x3a0d2971),
        (0xc04448c7, 0x3d3eb932, 0x3d3eb930),
        (0x3ffdeb70, 0x40e8a350, 0x40e8a351),
    ] {
        assert_eq!(expf(f(x)).to_bits(), want, "expf({})", f(x));
        assert_ne!(
            want, libm,
            "golden value must differ from libm to mean anything"
        );
    }
}

#[test]
fn expf_is_accurate_and_saturates() {
    let mut worst = 0f64;
    let mut x = -87.0f32;
    while x < 88.0 {
        let want = (x as f64).exp();
        let got = expf(x) as f64;
        worst = worst.max(((got - want) / want).abs());
        x += 0.0137;
    }
    assert!(worst < 3e-7, "relative error {worst}");
    assert_eq!(expf(0.0), 1.0);
    assert_eq!(expf(f32::NEG_INFINITY), 0.0);
    assert_eq!(expf(-200.0), 0.0);
    assert_eq!(expf(200.0), f32::INFINITY);
    assert!(expf(f32::NAN).is_nan());
    // Between the normal-exponent range and the cut-off: tiny, subnormal, or huge.
    assert!(expf(-100.0) > 0.0 && expf(-100.0) < 1e-43);
    assert!(expf(88.5) == f32::INFINITY || expf(88.5) > 1e38);
}

#[test]
fn swiglu_blocks_use_ggml_exp_and_the_tail_uses_libm() {
    let mut rng = Rng::new(3);
    // 40 = two 16-blocks (ggml's vector path) + an 8-element tail (libm).
    let mut g = rng.vec(40, 12.0);
    g[3] = -100.0; // exponent out of the fast range: the SIMD path's per-lane fallback
    g[20] = 95.0;
    let u = rng.vec(40, 2.0);
    let mut out = g.clone();
    swiglu(&mut out, &u);
    for i in 0..40 {
        let want = if i < 32 {
            silu(g[i]) * u[i]
        } else {
            g[i] / (1.0 + (-g[i]).exp()) * u[i]
        };
        assert_eq!(out[i].to_bits(), want.to_bits(), "element {i} ({})", g[i]);
    }
}

/// The elementwise kernels give the portable path's bits on every instruction set this CPU
/// has, over lengths with and without a tail and inputs that reach `exp`'s far ranges.
#[test]
fn glus_softmax_and_norm_give_the_same_bits_on_every_isa() {
    let isas = Isa::available();
    eprintln!("instruction sets: {isas:?}");
    let mut rng = Rng::new(11);
    for n in [0usize, 1, 15, 16, 17, 40, 64, 576, 1000, 1536] {
        let mut g = rng.vec(n, 12.0);
        let u = rng.vec(n, 2.0);
        let mut logits = rng.vec(n, 30.0);
        for (i, v) in [-100.0f32, 95.0, -200.0, f32::NEG_INFINITY]
            .into_iter()
            .enumerate()
        {
            if let Some(x) = g.get_mut(i * 5 + 2) {
                *x = v.max(-150.0);
            }
            if let Some(x) = logits.get_mut(i * 7 + 1) {
                *x = v;
            }
        }
        // GeGLU's ends, exactly and an f16 rounding away.
        for (i, v) in [-10.0f32, 10.0, -9.996, 9.996, -10.004, 10.004]
            .into_iter()
            .enumerate()
        {
            if let Some(x) = g.get_mut(i * 3 + 1) {
                *x = v;
            }
        }
        let w = rng.vec(n, 1.5);
        let mut want_g = g.clone();
        swiglu_with(Isa::Portable, &mut want_g, &u);
        let mut want_ge = g.clone();
        geglu_with(Isa::Portable, &mut want_ge, &u);
        let mut want_s = logits.clone();
        softmax_with(Isa::Portable, &mut want_s);
        let mut want_n = vec![0f32; n];
        rms_norm_with(Isa::Portable, &g, &w, 1e-5, &mut want_n);
        for &isa in &isas {
            let mut got = g.clone();
            swiglu_with(isa, &mut got, &u);
            assert_eq!(bits(&got), bits(&want_g), "swiglu, {isa}, n = {n}");
            let mut got = g.clone();
            geglu_with(isa, &mut got, &u);
            assert_eq!(bits(&got), bits(&want_ge), "geglu, {isa}, n = {n}");
            let mut got = logits.clone();
            softmax_with(isa, &mut got);
            assert_eq!(bits(&got), bits(&want_s), "softmax, {isa}, n = {n}");
            let mut got = vec![0f32; n];
            rms_norm_with(isa, &g, &w, 1e-5, &mut got);
            assert_eq!(bits(&got), bits(&want_n), "rms_norm, {isa}, n = {n}");
        }
    }
}

/// GeGLU's vector kernels round each input to f16 as `half` does: a sweep of f32 bit patterns
/// over the whole line (NaNs only need to stay NaN).
#[test]
fn geglu_gives_the_portable_bits_across_the_f32_line() {
    let g: Vec<f32> = (0..1u64 << 20)
        .map(|i| f32::from_bits((i * 4093) as u32))
        .collect();
    let u: Vec<f32> = (0..g.len()).map(|i| 0.5 + (i % 7) as f32).collect();
    let mut want = g.clone();
    geglu_with(Isa::Portable, &mut want, &u);
    for isa in Isa::available() {
        let mut got = g.clone();
        geglu_with(isa, &mut got, &u);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{isa}: geglu({:e}) = {a:e}, portable {b:e}",
                g[i]
            );
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// ggml's GELU table is built by C compiled with GCC, which contracts `1 + a*x*x` into a
/// fused multiply-add. Of all f16 inputs in (-10, 10), one rounds differently for it: -0x1.ffcp+0
/// gives 0xa9d3 with the contraction and 0xa9d2 without (found by compiling ggml's formula
/// with GCC, `-O3 -std=gnu11`, against the same formula with every step rounded).
#[test]
fn gelu_table_rounds_like_gcc_built_ggml() {
    let x = half::f16::from_bits(0xbfff).to_f32();
    let mut g = [x];
    geglu(&mut g, &[1.0]);
    assert_eq!(half::f16::from_f32(g[0]).to_bits(), 0xa9d3, "gelu({x})");
}

#[test]
fn reduce16_adds_halves_then_quarters_then_pairs() {
    let mut a = [1.0f32; 16];
    a[0] = 1e8;
    a[8] = -1e8;
    // The halves cancel first, so every 1.0 survives (a left-to-right sum loses them).
    assert_eq!(reduce16(&a), 14.0);
    let seq: f32 = a.iter().sum();
    assert_ne!(seq, 14.0);
}

#[test]
fn rope_uses_fused_multiply_add_like_ggml() {
    let rope = Rope {
        base: 100000.0,
        n_dims: 64,
        head_dim: 64,
    };
    // (position, pair, x0, x1) -> llama.cpp's rotated pair (a plain a*c - b*s is an ulp off).
    for (pos, pair, x0, x1, y0, y1) in [
        (3, 0, 0xbf7fc039, 0x3e962294, 0x3f729911, 0xbedcd0d3),
        (3, 12, 0xbef7f1f1, 0x3d5d7210, 0xbef8da92, 0x3d0def9b),
        (3, 5, 0x3ea1fda4, 0xbe26f8e6, 0x3eb6333d, 0x3befed2d),
    ] {
        let mut x = vec![0f32; 64];
        x[2 * pair] = f(x0);
        x[2 * pair + 1] = f(x1);
        rope.apply(&mut x, pos);
        assert_eq!(
            (x[2 * pair].to_bits(), x[2 * pair + 1].to_bits()),
            (y0, y1),
            "pos {pos} pair {pair}"
        );
    }
}
