//! Rotary position embedding, llama "normal" style (ggml `GGML_ROPE_TYPE_NORM`): dimension
//! pairs are adjacent, `(x[2i], x[2i+1])` is rotated by `pos * base^(-2i/n_dims)`. The angle
//! is built by repeated multiplication in f32, exactly like ggml, and the rotation uses the
//! fused multiply-adds GCC makes of ggml's `x0*cos - x1*sin`, `x0*sin + x1*cos`, so the
//! result is bit-identical to llama.cpp's. The NeoX style (`GGML_ROPE_TYPE_NEOX`, Gemma)
//! pairs `x[i]` with `x[i + n_dims/2]` instead, with the same angles and arithmetic.

use crate::isa::Isa;

/// Rotary embedding parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Frequency base (`rope.freq_base`).
    pub base: f32,
    /// Rotated dimensions per head (`rope.dimension_count`), <= head_dim, even.
    pub n_dims: usize,
    /// Elements per head.
    pub head_dim: usize,
}

impl Rope {
    /// Cosine and sine for each rotated pair at `pos`.
    pub fn cos_sin(&self, pos: usize) -> Vec<(f32, f32)> {
        self.cos_sin_scaled(pos, 1.0, None)
    }

    /// [`Rope::cos_sin`] with linear scaling and per-pair frequency factors, as ggml's rope
    /// cache builds them: pair `i`'s angle is `freq_scale * (theta_i / factors[i])` (Llama 3's
    /// `rope_freqs`, linear `rope.scaling.factor`). A scale of 1 and no factors give
    /// `cos_sin`'s bits.
    ///
    /// # Panics
    /// When `factors` is given with fewer than `n_dims / 2` entries.
    pub fn cos_sin_scaled(
        &self,
        pos: usize,
        freq_scale: f32,
        factors: Option<&[f32]>,
    ) -> Vec<(f32, f32)> {
        let pairs = self.n_dims / 2;
        if let Some(f) = factors {
            assert!(
                f.len() >= pairs,
                "rope: {} factors for {pairs} pairs",
                f.len()
            );
        }
        let scale = self.base.powf(-2.0 / self.n_dims as f32);
        let mut theta = pos as f32;
        (0..pairs)
            .map(|i| {
                let ff = factors.map_or(1.0, |f| f[i]);
                let t = freq_scale * (theta / ff);
                theta *= scale;
                (t.cos(), t.sin())
            })
            .collect()
    }

    /// Rotates every head of one token's `x` (`heads * head_dim`) in place for position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let cs = self.cos_sin(pos);
        self.apply_with(x, &cs);
    }

    /// [`Rope::apply`] with precomputed `cos_sin(pos)`.
    pub fn apply_with(&self, x: &mut [f32], cs: &[(f32, f32)]) {
        self.rotate(x, cs, false)
    }

    /// [`Rope::apply_with`] in the NeoX style: pair `i` is `(x[i], x[i + n_dims/2])`.
    pub fn apply_neox_with(&self, x: &mut [f32], cs: &[(f32, f32)]) {
        self.rotate(x, cs, true)
    }

    fn rotate(&self, x: &mut [f32], cs: &[(f32, f32)], neox: bool) {
        assert_eq!(x.len() % self.head_dim, 0, "rope: width");
        assert!(
            2 * cs.len() <= self.head_dim,
            "rope: more pairs than the head holds"
        );
        match Isa::detect() {
            Isa::Portable => rotate(x, self.head_dim, cs, neox),
            // SAFETY: Avx2 is only detected when the CPU has avx2 and fma.
            Isa::Avx2 | Isa::Avx512 => unsafe { rotate_fma(x, self.head_dim, cs, neox) },
        }
    }
}

/// [`rotate`] compiled with hardware fused multiply-add.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn rotate_fma(x: &mut [f32], head_dim: usize, cs: &[(f32, f32)], neox: bool) {
    rotate(x, head_dim, cs, neox)
}

/// Rotates `(a, b)` by the angle whose cosine and sine are `c`, `s`.
#[inline(always)]
fn turn(a: f32, b: f32, c: f32, s: f32) -> (f32, f32) {
    (a.mul_add(c, -(b * s)), a.mul_add(s, b * c))
}

#[inline(always)]
fn rotate(x: &mut [f32], head_dim: usize, cs: &[(f32, f32)], neox: bool) {
    for head in x.chunks_exact_mut(head_dim) {
        if neox {
            let half = cs.len();
            for (i, &(c, s)) in cs.iter().enumerate() {
                (head[i], head[i + half]) = turn(head[i], head[i + half], c, s);
            }
        } else {
            for (p, &(c, s)) in head.chunks_exact_mut(2).zip(cs) {
                (p[0], p[1]) = turn(p[0], p[1], c, s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_angles_divide_by_the_factor_then_scale() {
        let rope = Rope {
            base: 500_000.0,
            n_dims: 8,
            head_dim: 8,
        };
        let plain = rope.cos_sin(37);
        assert_eq!(rope.cos_sin_scaled(37, 1.0, None), plain);
        let factors = [1.0, 2.0, 4.0, 8.0];
        let scaled = rope.cos_sin_scaled(37, 0.25, Some(&factors));
        let scale = rope.base.powf(-2.0 / rope.n_dims as f32);
        let mut theta = 37f32;
        for (i, &(c, s)) in scaled.iter().enumerate() {
            let t = 0.25 * (theta / factors[i]);
            assert_eq!((c, s), (t.cos(), t.sin()), "pair {i}");
            theta *= scale;
        }
        assert_ne!(scaled[1], plain[1]);
    }
}
