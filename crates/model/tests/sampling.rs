//! Sampling and stop sequences: greedy ties, reproducible seeds, top-k/top-p reductions,
//! the temperature-1 distribution, stop strings split across pushes; penalties, min-p,
//! `min_tokens`, end tokens and raw logprobs.

use pagewarden_model::{
    argmax, EndTokens, Sampler, SamplingParams, StopMatcher, StopOutcome, TokenLogprobs,
};
use proptest::prelude::*;

fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

fn logits_strategy() -> impl Strategy<Value = Vec<f32>> {
    // Coarse values so ties are common.
    prop::collection::vec((-8i32..8).prop_map(|x| x as f32 * 0.5), 1..64)
}

#[test]
fn greedy_is_argmax_with_ties_to_lowest_id() {
    let mut s = Sampler::new(&SamplingParams::greedy(4));
    assert_eq!(s.sample(&[0.0, 3.0, 1.0, 3.0]), 1);
    assert_eq!(s.sample(&[f32::NAN, -1.0, -1.0]), 1);
    assert_eq!(s.sample(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    assert_eq!(argmax(&[2.0, f32::NAN, 5.0]), 2);
}

#[test]
fn temperature_one_follows_the_softmax() {
    // p(1) = 3 / (1 + 3) = 0.75.
    let logits = [0.0, 3f32.ln()];
    let mut s = Sampler::new(&params(1.0, 0, 1.0, 42));
    let n = 8000;
    let ones = (0..n).filter(|_| s.sample(&logits) == 1).count();
    let freq = ones as f64 / n as f64;
    assert!((freq - 0.75).abs() < 0.03, "frequency {freq}");
    // Top-k 1 of the same logits is always the favourite.
    let mut k1 = Sampler::new(&params(1.0, 1, 1.0, 42));
    assert!((0..100).all(|_| k1.sample(&logits) == 1));
}

#[test]
fn top_k_and_top_p_restrict_the_candidates() {
    let logits = [5.0, 4.9, 4.8, -10.0, 4.7];
    let mut s = Sampler::new(&params(1.0, 2, 1.0, 7));
    assert!((0..500).all(|_| s.sample(&logits) <= 1));
    // top_p = 0.5 keeps the top two (0.26 + 0.24 ≈ 0.5 is reached at the second or third).
    let mut s = Sampler::new(&params(1.0, 0, 0.5, 7));
    let seen: std::collections::BTreeSet<u32> = (0..500).map(|_| s.sample(&logits)).collect();
    assert!(seen.iter().all(|&t| t <= 2) && seen.len() >= 2, "{seen:?}");
}

#[test]
fn unseeded_samplers_still_sample() {
    let mut s = Sampler::new(&SamplingParams::default());
    assert!(s.sample(&[0.0, 0.0, 0.0]) < 3);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn same_seed_same_tokens(logits in logits_strategy(), seed in any::<u64>(), t in 0.1f32..2.0, k in 0usize..8, p in 0.05f32..1.0) {
        let mut a = Sampler::new(&params(t, k, p, seed));
        let mut b = Sampler::new(&params(t, k, p, seed));
        let xs: Vec<u32> = (0..32).map(|_| a.sample(&logits)).collect();
        let ys: Vec<u32> = (0..32).map(|_| b.sample(&logits)).collect();
        prop_assert_eq!(xs, ys);
    }

    #[test]
    fn argmax_is_the_first_largest_non_nan(
        logits in prop::collection::vec(
            prop_oneof![
                8 => (-4i8..4).prop_map(|v| f32::from(v) * 0.5),
                1 => Just(f32::NAN),
                1 => Just(f32::NEG_INFINITY),
                1 => Just(-0.0f32),
            ],
            0..300,
        )
    ) {
        // The plain loop: across the vectorized passes' chunks of 16 and 64, ties, NaN and -inf.
        let mut want = None::<(usize, f32)>;
        for (i, &v) in logits.iter().enumerate() {
            if !v.is_nan() && want.is_none_or(|(_, b)| v > b) {
                want = Some((i, v));
            }
        }
        prop_assert_eq!(argmax(&logits) as usize, want.map_or(0, |(i, _)| i));
    }

    #[test]
    fn top_k_one_is_greedy(logits in logits_strategy(), seed in any::<u64>(), t in 0.1f32..2.0) {
        let mut s = Sampler::new(&params(t, 1, 1.0, seed));
        prop_assert_eq!(s.sample(&logits), argmax(&logits));
    }

    #[test]
    fn tiny_top_p_is_greedy(logits in logits_strategy(), seed in any::<u64>(), t in 0.1f32..2.0) {
        let mut s = Sampler::new(&params(t, 0, 1e-6, seed));
        prop_assert_eq!(s.sample(&logits), argmax(&logits));
    }

    #[test]
    fn zero_temperature_is_greedy(logits in logits_strategy(), seed in any::<u64>()) {
        let mut s = Sampler::new(&params(0.0, 0, 1.0, seed));
        prop_assert_eq!(s.sample(&logits), argmax(&logits));
    }

    #[test]
    fn stop_matching_is_split_invariant(text in "[ab<|>]{0,24}", cuts in prop::collection::vec(0usize..24, 0..6)) {
        // Emitted text never contains the stop string and equals the text before its first
        // occurrence, however the text is chunked.
        let stop = "<|a";
        let mut m = StopMatcher::new(&[stop, ""]);
        let mut out = String::new();
        let mut stopped = false;
        let mut cuts = cuts;
        cuts.push(text.len());
        cuts.sort_unstable();
        let mut from = 0;
        for c in cuts {
            let c = c.min(text.len()).max(from);
            match m.push(&text[from..c]) {
                StopOutcome::Continue(s) => out.push_str(&s),
                StopOutcome::Stop(s) => { out.push_str(&s); stopped = true; break; }
            }
            from = c;
        }
        if !stopped {
            out.push_str(&m.finish());
        }
        let want = text.find(stop).map_or(text.as_str(), |i| &text[..i]);
        prop_assert_eq!(out, want);
        prop_assert_eq!(stopped, text.contains(stop));
    }
}

#[test]
fn stop_matcher_holds_possible_prefixes() {
    let mut m = StopMatcher::new(&["\n\nUser:", "###"]);
    assert_eq!(m.push("Hello"), StopOutcome::Continue("Hello".into()));
    assert_eq!(m.push(" world\n"), StopOutcome::Continue(" world".into()));
    assert_eq!(m.push("\nUs"), StopOutcome::Continue(String::new()));
    assert_eq!(m.push("ually"), StopOutcome::Continue("\n\nUsually".into()));
    assert_eq!(m.push("#"), StopOutcome::Continue(String::new()));
    assert_eq!(m.push("##tail"), StopOutcome::Stop(String::new()));
    let mut m = StopMatcher::new(&["é!"]);
    assert_eq!(m.push("café"), StopOutcome::Continue("caf".into()));
    assert_eq!(m.finish(), "é");
}

#[test]
fn a_tiny_positive_temperature_picks_the_most_likely_token() {
    let logits = [0.5f32, 9.0, -3.0, 2.0];
    // 1e-45 and 1e-40 make `1 / t` overflow to infinity.
    for t in [1e-45f32, 1e-40, 1e-30, 1e-6] {
        let p = SamplingParams {
            temperature: t,
            seed: Some(1),
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(&p);
        for _ in 0..20 {
            assert_eq!(s.sample(&logits), 1, "temperature {t}");
        }
    }
}

#[test]
fn penalties_steer_greedy_away_from_repeats() {
    let logits = [1.0f32, 2.0, 1.5];
    let greedy = |p: SamplingParams| {
        let mut s = Sampler::for_request(&p, &[1], &[]);
        (0..3).map(|_| s.sample(&logits)).collect::<Vec<_>>()
    };
    assert_eq!(greedy(SamplingParams::greedy(3)), [1, 1, 1]);
    // 2.0 / 1.5 < 1.5: the prompt's token 1 loses at once, then 2 is penalized as well.
    let rep = SamplingParams {
        repetition_penalty: 1.5,
        ..SamplingParams::greedy(3)
    };
    assert_eq!(greedy(rep), [2, 1, 1]);
    // Token 1 pays 0.6 per use: 2.0, then 1.4 < 1.5, then 2 pays too (1.5 - 0.6 < 1.4).
    let freq = SamplingParams {
        frequency_penalty: 0.6,
        ..SamplingParams::greedy(3)
    };
    assert_eq!(greedy(freq), [1, 2, 1]);
    let presence = SamplingParams {
        presence_penalty: 1.2,
        ..SamplingParams::greedy(3)
    };
    assert_eq!(greedy(presence), [1, 2, 0]);
}

#[test]
fn min_tokens_masks_end_tokens_until_reached() {
    let logits = [0.0f32, 5.0, 1.0, 4.0];
    let p = SamplingParams {
        min_tokens: 2,
        stop_token_ids: vec![3],
        ..SamplingParams::greedy(8)
    };
    let mut s = Sampler::for_request(&p, &[], &[1]);
    assert_eq!(s.sample(&logits), 2, "neither the eog 1 nor the stop id 3");
    s.accept(2); // a token sampled elsewhere counts too
    assert_eq!(s.sample(&logits), 1);
    let end = EndTokens::new(&p, &[1]);
    assert!(end.contains(1) && end.contains(3) && !end.contains(2));
    let ignore = SamplingParams {
        ignore_eos: true,
        ..p
    };
    let end = EndTokens::new(&ignore, &[1]);
    assert!(!end.contains(1) && end.contains(3));
    let mut s = Sampler::for_request(&ignore, &[], &[1]);
    assert_eq!(
        s.sample(&logits),
        1,
        "with ignore_eos the eog token is ordinary"
    );
}

#[test]
fn min_p_drops_unlikely_tokens() {
    // p(0) / p(1) = e^-3 < 0.1: only token 1 survives min_p 0.1.
    let logits = [0.0f32, 3.0];
    let p = SamplingParams {
        min_p: 0.1,
        ..params(1.0, 0, 1.0, 3)
    };
    let mut s = Sampler::new(&p);
    assert!((0..500).all(|_| s.sample(&logits) == 1));
}

#[test]
fn logprobs_describe_the_raw_logits() {
    let logits = [1.0f32, 2.0, 1.5];
    let p = SamplingParams {
        repetition_penalty: 3.0,
        temperature: 0.5,
        logprobs: Some(2),
        ..params(0.5, 0, 1.0, 9)
    };
    let mut s = Sampler::for_request(&p, &[1], &[]);
    let got = s.next(&logits);
    let want = TokenLogprobs::compute(&logits, got.token, 2);
    assert_eq!(got.logprobs, Some(want.clone()));
    assert_eq!(
        want.top[0].token, 1,
        "penalties do not change what is reported"
    );
    assert_eq!(
        Sampler::new(&params(0.0, 0, 1.0, 1)).next(&logits).logprobs,
        None
    );
}

#[test]
fn logit_bias_shifts_logits_before_sampling_and_masks_still_hold() {
    let logits = [0.0f32, 5.0, 1.0, 4.0];
    // Greedy picks 1; a bias of 100 on 2 forces it, −100 on 1 bans it (3 wins).
    let forced = SamplingParams {
        logit_bias: vec![(2, 100.0)],
        ..SamplingParams::greedy(8)
    };
    assert_eq!(Sampler::new(&forced).sample(&logits), 2);
    let banned = SamplingParams {
        logit_bias: vec![(1, -100.0)],
        ..SamplingParams::greedy(8)
    };
    assert_eq!(Sampler::new(&banned).sample(&logits), 3);
    // Sampling at temperature 1 never draws a banned token and always the forced one.
    for seed in 0..50 {
        let p = SamplingParams {
            logit_bias: vec![(1, -100.0), (3, -100.0)],
            ..params(1.0, 0, 1.0, seed)
        };
        let t = Sampler::new(&p).sample(&logits);
        assert!(t == 0 || t == 2, "seed {seed}: drew banned token {t}");
        let p = SamplingParams {
            logit_bias: vec![(0, 100.0)],
            ..params(1.0, 0, 1.0, seed)
        };
        assert_eq!(Sampler::new(&p).sample(&logits), 0, "seed {seed}");
    }
    // min_tokens' mask wins over a bias towards an end token; ids past the vocabulary are
    // ignored.
    let p = SamplingParams {
        min_tokens: 1,
        stop_token_ids: vec![3],
        logit_bias: vec![(3, 100.0), (99, 100.0)],
        ..SamplingParams::greedy(8)
    };
    let mut s = Sampler::for_request(&p, &[], &[]);
    assert_eq!(s.sample(&logits), 1);
    assert_eq!(s.sample(&logits), 3);
    // Logprobs stay those of the raw logits, as without a bias.
    let p = SamplingParams {
        logit_bias: vec![(2, 100.0)],
        logprobs: Some(0),
        ..SamplingParams::greedy(8)
    };
    let got = Sampler::new(&p).next(&logits);
    assert_eq!(got.token, 2);
    let raw = TokenLogprobs::compute(&logits, 2, 0);
    assert_eq!(got.logprobs, Some(raw));
}
