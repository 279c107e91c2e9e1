//! `Sampler`: penalties, `min_tokens`, then greedy (argmax, ties to the
//! lowest id) or temperature, min-p, top-k, top-p, with a seeded RNG so a seeded request replays
//! token for token; `EndTokens`, the sampled ids that end a generation. The parameters
//! themselves, their limits and their range check are `pagewarden_types::sampling`'s.
//!
//! Order per step (vLLM's): logprobs of the raw logits; penalties; the grammar's mask
//! (`response_format`, see `constraint.rs`); end tokens masked while fewer than `min_tokens`
//! were generated; then greedy, or temperature → min-p → top-k → top-p.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use pagewarden_types::sampling::SamplingParams;

use crate::constraint::Constraint;
use crate::logprobs::TokenLogprobs;
use crate::penalties::Penalties;
use crate::tokenizer::Tokenizer;

/// The sampled ids that end a generation and are not part of it: the model's
/// end-of-generation tokens (unless `ignore_eos`) and `stop_token_ids`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndTokens(Vec<u32>);

impl EndTokens {
    /// The end tokens of a request sampled with `p` from a model whose end-of-generation
    /// tokens are `eog`.
    pub fn new(p: &SamplingParams, eog: &[u32]) -> Self {
        let model = if p.ignore_eos { &[][..] } else { eog };
        let mut ids: Vec<u32> = model.iter().chain(&p.stop_token_ids).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        EndTokens(ids)
    }

    /// Whether `token` ends the generation.
    pub fn contains(&self, token: u32) -> bool {
        self.0.binary_search(&token).is_ok()
    }
}

/// One sampled token and, when the request asked for them, its logprobs.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// Logprobs of the raw logits (see `logprobs.rs`), when requested.
    pub logprobs: Option<TokenLogprobs>,
}

/// Picks tokens from logits according to `SamplingParams`; holds the request's RNG and the
/// history its penalties and `min_tokens` need.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    greedy: bool,
    rng: StdRng,
    penalties: Option<Penalties>,
    /// Masked while fewer than `min_tokens` tokens were generated.
    end: EndTokens,
    min_tokens: usize,
    generated: usize,
    logprobs: Option<usize>,
    /// The request's grammar, when it has one.
    constraint: Option<Constraint>,
    /// `logit_bias`: added to these tokens' logits.
    bias: Vec<(u32, f32)>,
    /// Reused scratch: (id, logit or probability).
    cands: Vec<(u32, f32)>,
    /// Reused scratch: the logits after penalties and masking.
    adjusted: Vec<f32>,
}

impl Sampler {
    /// A sampler for `p` without prompt history or end tokens (a repetition penalty then sees
    /// only generated tokens, and `min_tokens` masks only `stop_token_ids`), seeded from
    /// `p.seed` (or the OS when `None`).
    pub fn new(p: &SamplingParams) -> Self {
        Self::for_request(p, &[], &[])
    }

    /// A sampler for one request: `prompt` for the repetition penalty, `eog` the model's
    /// end-of-generation tokens.
    pub fn for_request(p: &SamplingParams, prompt: &[u32], eog: &[u32]) -> Self {
        let seed = p.seed.unwrap_or_else(rand::random);
        Sampler {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            greedy: p.is_greedy(),
            rng: StdRng::seed_from_u64(seed),
            penalties: Penalties::new(p, prompt),
            end: EndTokens::new(p, eog),
            min_tokens: p.min_tokens,
            generated: 0,
            logprobs: p.logprobs,
            constraint: None,
            bias: p.logit_bias.clone(),
            cands: Vec::new(),
            adjusted: Vec::new(),
        }
    }

    /// A sampler for one request to the model whose tokenizer is `tok`: [`Sampler::for_request`]
    /// with its end tokens, and the request's grammar compiled against its vocabulary.
    /// A grammar that does not compile leaves only end tokens (see [`Constraint::for_tokenizer`]).
    pub fn for_model(p: &SamplingParams, prompt: &[u32], tok: &Tokenizer) -> Self {
        let mut s = Self::for_request(p, prompt, tok.eog_tokens());
        s.constraint = p
            .grammar
            .as_ref()
            .map(|g| Constraint::for_tokenizer(tok, g));
        s
    }

    /// Records a token generated for this request elsewhere (decode continues from the token
    /// prefill sampled), as [`Sampler::next`] records its own.
    pub fn accept(&mut self, token: u32) {
        if let Some(c) = &mut self.constraint {
            c.accept(token);
        }
        self.generated += 1;
        if let Some(p) = &mut self.penalties {
            p.record(token);
        }
    }

    /// The next token for `logits` (one per vocabulary entry); NaN logits never win.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.next(logits).token
    }

    /// The next token for `logits` with its logprobs when requested; records the token.
    ///
    /// # Panics
    /// When `logits` is empty.
    pub fn next(&mut self, logits: &[f32]) -> Sampled {
        assert!(!logits.is_empty(), "Sampler::next: empty logits");
        // A complete document ends even before `min_tokens`: the grammar wins.
        let mask = self.generated < self.min_tokens
            && !self
                .constraint
                .as_mut()
                .is_some_and(Constraint::is_complete);
        let adjust =
            self.penalties.is_some() || !self.bias.is_empty() || self.constraint.is_some() || mask;
        let token = if adjust {
            let mut adjusted = std::mem::take(&mut self.adjusted);
            adjusted.clear();
            adjusted.extend_from_slice(logits);
            if let Some(p) = &self.penalties {
                p.apply(&mut adjusted);
            }
            for &(t, b) in &self.bias {
                if let Some(l) = adjusted.get_mut(t as usize) {
                    *l += b;
                }
            }
            if let Some(c) = &mut self.constraint {
                c.mask(&mut adjusted);
            }
            if mask {
                for &t in &self.end.0 {
                    if let Some(l) = adjusted.get_mut(t as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            let token = self.pick(&adjusted);
            self.adjusted = adjusted;
            token
        } else {
            self.pick(logits)
        };
        let logprobs = self
            .logprobs
            .map(|n| TokenLogprobs::compute(logits, token, n));
        self.accept(token);
        Sampled { token, logprobs }
    }

    fn pick(&mut self, logits: &[f32]) -> u32 {
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
        if self.min_p > 0.0 {
            // p >= min_p * p_max  <=>  scaled logit >= max + ln(min_p).
            let max = self
                .cands
                .iter()
                .map(|c| c.1)
                .fold(f32::NEG_INFINITY, f32::max);
            if max.is_finite() {
                let floor = max + self.min_p.ln();
                self.cands.retain(|c| c.1 >= floor);
            }
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
///
/// Two passes the compiler vectorizes, as a greedy decode step runs this once per sequence
/// over the whole vocabulary (262,144 logits for Gemma 3: a branch per logit took ~0.3 ms, 16
/// sequences ~5 ms of a step, against ~25 µs each now): the largest value (a comparison with
/// NaN is false, so NaN never replaces a lane's best), then the first index holding it. A
/// value of -inf is found as the first non-NaN logit is, and -0.0 == 0.0 keeps the first.
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    const SCAN: usize = 64;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let holds_max = |c: &[f32]| c.iter().fold(false, |hit, &v| hit | (v == max));
    logits
        .chunks(SCAN)
        .position(holds_max)
        .and_then(|ci| {
            let at = ci * SCAN;
            logits[at..].iter().position(|&v| v == max).map(|j| at + j)
        })
        .unwrap_or(0) as u32
}
