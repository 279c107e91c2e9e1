//! Rotary position embedding, llama "normal" style (ggml `GGML_ROPE_TYPE_NORM`): dimension
//! pairs are adjacent, `(x[2i], x[2i+1])` is rotated by `pos * base^(-2i/n_dims)`. The angle
//! is built by repeated multiplication in f32, exactly like ggml, so logits match llama.cpp.

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
        let scale = self.base.powf(-2.0 / self.n_dims as f32);
        let mut theta = pos as f32;
        (0..self.n_dims / 2)
            .map(|_| {
                let cs = (theta.cos(), theta.sin());
                theta *= scale;
                cs
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
        assert_eq!(x.len() % self.head_dim, 0, "rope: width");
        for head in x.chunks_exact_mut(self.head_dim) {
            for (i, (c, s)) in cs.iter().enumerate() {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * c - b * s;
                head[2 * i + 1] = a * s + b * c;
            }
        }
    }
}
