//! `SamplingParams` and `Sampler`: greedy (argmax, ties to the lowest id), temperature, top-k,
//! top-p, with a seeded RNG so a seeded request replays token for token.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How to pick each next token, and when to stop.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`;
    /// `>= 1` disables.
    pub top_p: f32,
    /// RNG seed; `None` draws one from the OS.
    pub seed: Option<u64>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Stop sequences; generation ends before the first one (see `StopMatcher`).
    pub stop: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
            max_tokens: 256,
            stop: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams {
            temperature: 0.0,
            max_tokens,
            ..SamplingParams::default()
        }
    }

    /// Whether sampling reduces to argmax: no temperature, a temperature so small that
    /// `logit / temperature` would overflow (it tends to argmax anyway; left to the arithmetic
    /// it picked the least likely token), or `top_k == 1`.
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW || self.top_k == 1
    }
}

/// Temperatures below this sample greedily: `1 / t` times any logit stays far from `f32`
/// overflow above it.
pub const GREEDY_BELOW: f32 = 1e-4;

/// Picks tokens from logits according to `SamplingParams`; holds the request's RNG.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    greedy: bool,
    rng: StdRng,
    /// Reused scratch: (id, logit or probability).
    cands: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler for `p`, seeded from `p.seed` (or the OS when `None`).
    pub fn new(p: &SamplingParams) -> Self {
        let seed = p.seed.unwrap_or_else(rand::random);
        Sampler {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            greedy: p.is_greedy(),
            rng: StdRng::seed_from_u64(seed),
            cands: Vec::new(),
        }
    }

    /// The next token for `logits` (one per vocabulary entry). NaN logits never win.
    ///
    /// # Panics
    /// When `logits` is empty.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        assert!(!logits.is_empty(), "Sampler::sample: empty logits");
        if self.greedy {
            return argmax(logits);
        }
        let inv_t = 1.0 / self.temperature;
        self.cands.clear();
        self.cands.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(i, &l)| (i as u32, l * inv_t)),
        );
        if self.cands.is_empty() {
            return 0;
        }
        // Highest first, lowest id among equals: a total order, so results are reproducible.
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if self.top_k > 0 && self.top_k < self.cands.len() {
            self.cands.select_nth_unstable_by(self.top_k - 1, order);
            self.cands.truncate(self.top_k);
        }
        self.cands.sort_unstable_by(order);
        let max = self.cands[0].1;
        if !max.is_finite() {
            // Overflowed scaling (huge logits): the limit of the distribution is the argmax.
            return self.cands[0].0;
        }
        let mut total = 0f64;
        for c in &mut self.cands {
            c.1 = (c.1 - max).exp();
            total += f64::from(c.1);
        }
        if self.top_p < 1.0 {
            let mut cum = 0f64;
            let mut keep = self.cands.len();
            for (i, c) in self.cands.iter().enumerate() {
                cum += f64::from(c.1) / total;
                if cum >= f64::from(self.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            self.cands.truncate(keep);
            total = self.cands.iter().map(|c| f64::from(c.1)).sum();
        }
        let mut r = self.rng.random::<f64>() * total;
        for c in &self.cands {
            r -= f64::from(c.1);
            if r < 0.0 {
                return c.0;
            }
        }
        // Rounding left a sliver: the last candidate takes it.
        self.cands[self.cands.len() - 1].0
    }
}

/// Index of the largest logit, lowest index among ties; NaN never wins (all-NaN gives 0).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    let mut found = false;
    for (i, &v) in logits.iter().enumerate() {
        if !v.is_nan() && (!found || v > best_v) {
            best = i;
            best_v = v;
            found = true;
        }
    }
    best as u32
}
