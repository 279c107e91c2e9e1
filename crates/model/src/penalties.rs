//! `Penalties`: the repetition penalty of vLLM and Hugging Face (over prompt and generated
//! tokens: a positive logit is divided by it, a negative one multiplied) and OpenAI's presence
//! and frequency penalties (over generated tokens: `logit -= presence * [count > 0] +
//! frequency * count`), with the per-sequence history they need. The history holds each
//! distinct token once, so it is bounded by the context.

use std::collections::{HashMap, HashSet};

use crate::SamplingParams;

/// One sequence's penalties and the tokens they look at.
#[derive(Debug, Clone)]
pub struct Penalties {
    repetition: f32,
    presence: f32,
    frequency: f32,
    /// Distinct prompt tokens (kept only for a repetition penalty).
    prompt: HashSet<u32>,
    /// Generated tokens and how often each was generated.
    generated: HashMap<u32, u32>,
}

impl Penalties {
    /// The penalties of `p` over `prompt`; `None` when every penalty is off.
    pub fn new(p: &SamplingParams, prompt: &[u32]) -> Option<Self> {
        let repetition = p.repetition_penalty != 1.0;
        if !repetition && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return None;
        }
        Some(Penalties {
            repetition: p.repetition_penalty,
            presence: p.presence_penalty,
            frequency: p.frequency_penalty,
            prompt: if repetition {
                prompt.iter().copied().collect()
            } else {
                HashSet::new()
            },
            generated: HashMap::new(),
        })
    }

    /// Records a generated token.
    pub fn record(&mut self, token: u32) {
        *self.generated.entry(token).or_default() += 1;
    }

    /// Applies the penalties to `logits` in place (ids outside `logits` are ignored).
    pub fn apply(&self, logits: &mut [f32]) {
        let r = self.repetition;
        let repeat = |l: &mut f32| *l = if *l > 0.0 { *l / r } else { *l * r };
        if r != 1.0 {
            for t in self
                .prompt
                .iter()
                .filter(|t| !self.generated.contains_key(t))
            {
                if let Some(l) = logits.get_mut(*t as usize) {
                    repeat(l);
                }
            }
        }
        for (&t, &count) in &self.generated {
            if let Some(l) = logits.get_mut(t as usize) {
                if r != 1.0 {
                    repeat(l);
                }
                *l -= self.presence + self.frequency * count as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(repetition: f32, presence: f32, frequency: f32) -> SamplingParams {
        SamplingParams {
            repetition_penalty: repetition,
            presence_penalty: presence,
            frequency_penalty: frequency,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn off_is_none() {
        assert!(Penalties::new(&params(1.0, 0.0, 0.0), &[1, 2]).is_none());
    }

    #[test]
    fn repetition_divides_positive_and_multiplies_negative_over_prompt_and_output() {
        let mut p = Penalties::new(&params(2.0, 0.0, 0.0), &[0, 1]).unwrap();
        p.record(2);
        p.record(2);
        let mut logits = [4.0, -4.0, 6.0, 8.0];
        p.apply(&mut logits);
        assert_eq!(
            logits,
            [2.0, -8.0, 3.0, 8.0],
            "once per token, however often seen"
        );
    }

    #[test]
    fn presence_and_frequency_count_only_generated_tokens() {
        let mut p = Penalties::new(&params(1.0, 0.5, 0.25), &[0]).unwrap();
        for t in [1, 1, 1, 2, 99] {
            p.record(t);
        }
        let mut logits = [1.0, 1.0, 1.0, 1.0];
        p.apply(&mut logits);
        assert_eq!(logits, [1.0, 1.0 - 0.5 - 0.75, 1.0 - 0.5 - 0.25, 1.0]);
    }
}
