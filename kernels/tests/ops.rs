//! RMSNorm, RoPE, SwiGLU and softmax against hand-computed values.

use pagewarden_kernels::activation::{silu, softmax, swiglu};
use pagewarden_kernels::norm::rms_norm;
use pagewarden_kernels::rope::Rope;

#[test]
fn rms_norm_scales_to_unit_rms() {
    let x = [3.0f32, -4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
    let w = [1.0, 2.0, 1.0, 1.0];
    let mut out = [0f32; 8];
    rms_norm(&x, &w, 0.0, &mut out);
    let r = (25.0f32 / 4.0).sqrt();
    assert!((out[0] - 3.0 / r).abs() < 1e-6);
    assert!((out[1] - 2.0 * -4.0 / r).abs() < 1e-6);
    assert!((out[4] - 1.0).abs() < 1e-6);
}

#[test]
fn rope_rotates_adjacent_pairs() {
    let rope = Rope {
        base: 10000.0,
        n_dims: 4,
        head_dim: 4,
    };
    let mut x = [1.0f32, 0.0, 1.0, 0.0];
    rope.apply(&mut x, 1);
    // pair 0 rotates by 1 rad, pair 1 by 1 * 10000^(-1/2) = 0.01 rad.
    assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
    assert!((x[2] - 0.01f32.cos()).abs() < 1e-6 && (x[3] - 0.01f32.sin()).abs() < 1e-6);
    let mut y = [0.3f32, -0.7, 0.2, 0.9];
    rope.apply(&mut y, 0);
    assert_eq!(y, [0.3, -0.7, 0.2, 0.9], "position 0 is the identity");
}

#[test]
fn swiglu_and_softmax() {
    assert!((silu(0.0)).abs() < 1e-7);
    assert!((silu(2.0) - 2.0 / (1.0 + (-2f32).exp())).abs() < 1e-6);
    let mut g = [1.0f32, -1.0];
    swiglu(&mut g, &[2.0, 3.0]);
    assert!((g[0] - 2.0 * silu(1.0)).abs() < 1e-6 && (g[1] - 3.0 * silu(-1.0)).abs() < 1e-6);
    let mut s = [1000.0f32, 1000.0, f32::NEG_INFINITY];
    softmax(&mut s);
    assert_eq!(s, [0.5, 0.5, 0.0]);
}
