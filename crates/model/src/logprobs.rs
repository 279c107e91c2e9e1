//! `TokenLogprobs`: the log-softmax of one step's raw logits at the chosen token and at the most
//! likely ones. Raw means what the model produced, before penalties, temperature and
//! truncation: vLLM's default (`logprobs_mode = raw_logprobs`), so a logprob describes the
//! model, not the request's sampling settings.

/// Logprobs are reported no lower than this (vLLM's floor): `-inf` has no JSON spelling.
pub const LOGPROB_FLOOR: f32 = -9999.0;

/// One token's log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Logprob {
    /// Token id.
    pub token: u32,
    /// Natural log of its probability under the raw logits, at least [`LOGPROB_FLOOR`].
    pub logprob: f32,
}

/// What one step reports about the token it chose.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token.
    pub chosen: Logprob,
    /// The `n` most likely tokens, most likely first (lowest id among equals).
    pub top: Vec<Logprob>,
}

impl TokenLogprobs {
    /// The log-softmax of `logits` at `chosen` and at the `n` most likely tokens (NaN logits
    /// count as impossible). Sums in `f64`, so large vocabularies lose no precision.
    pub fn compute(logits: &[f32], chosen: u32, n: usize) -> Self {
        let valid = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { l };
        let max = logits
            .iter()
            .map(|&l| valid(l))
            .fold(f32::NEG_INFINITY, f32::max);
        let lse = if max.is_finite() {
            let sum: f64 = logits
                .iter()
                .map(|&l| (f64::from(valid(l)) - f64::from(max)).exp())
                .sum();
            f64::from(max) + sum.ln()
        } else {
            0.0
        };
        let at = |token: u32| Logprob {
            token,
            logprob: logits.get(token as usize).map_or(LOGPROB_FLOOR, |&l| {
                ((f64::from(valid(l)) - lse) as f32).max(LOGPROB_FLOOR)
            }),
        };
        TokenLogprobs {
            chosen: at(chosen),
            top: top_n(logits, n).into_iter().map(at).collect(),
        }
    }
}

/// Ids of the `n` largest logits, largest first, lowest id among equals; NaN never ranks.
fn top_n(logits: &[f32], n: usize) -> Vec<u32> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return Vec::new();
    }
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || (top.len() == n && l <= top[n - 1].1) {
            continue;
        }
        // Strictly greater than everything after `at`: a later id never passes an equal one.
        let at = top.partition_point(|&(_, v)| v >= l);
        top.insert(at, (i as u32, l));
        top.truncate(n);
    }
    top.into_iter().map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(logits: &[f32], i: usize) -> f64 {
        let sum: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        f64::from(logits[i]) - sum.ln()
    }

    #[test]
    fn matches_the_naive_log_softmax_and_sorts_the_top() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5, 2.0];
        let lp = TokenLogprobs::compute(&logits, 4, 3);
        assert!((f64::from(lp.chosen.logprob) - naive(&logits, 4)).abs() < 1e-6);
        let ids: Vec<u32> = lp.top.iter().map(|l| l.token).collect();
        assert_eq!(ids, [1, 3, 5], "largest first, ties to the lowest id");
        for l in &lp.top {
            assert!((f64::from(l.logprob) - naive(&logits, l.token as usize)).abs() < 1e-6);
        }
        let total: f64 = (0..logits.len()).map(|i| naive(&logits, i).exp()).sum();
        assert!((total - 1.0).abs() < 1e-9);
    }

    #[test]
    fn impossible_tokens_are_floored_and_nan_never_ranks() {
        let logits = [f32::NAN, 0.0, f32::NEG_INFINITY];
        let lp = TokenLogprobs::compute(&logits, 2, 5);
        assert_eq!(lp.chosen.logprob, LOGPROB_FLOOR);
        assert_eq!(lp.top.len(), 2, "NaN is not a candidate");
        assert_eq!(lp.top[0].token, 1);
        assert_eq!(lp.top[0].logprob, 0.0);
        assert!(TokenLogprobs::compute(&logits, 0, 0).top.is_empty());
    }
}
