//! The request parts both workers parse: malformed ones become `INVALID_ARGUMENT` with a
//! message for the client.

use pagewarden_model::{Logprob, TokenLogprobs};
use pagewarden_proto::v1 as pb;
use pagewarden_worker::wire::{logprobs, parse_logprobs, prompt_ids, sampling};
use tonic::Code;

fn params(temperature: f32, top_p: f32) -> pb::SamplingParams {
    pb::SamplingParams {
        temperature,
        top_p,
        max_tokens: 8,
        ..Default::default()
    }
}

#[test]
fn sampling_refuses_bad_temperature_and_top_p() {
    let s = sampling(Some(&params(0.0, 1.0))).expect("greedy is valid");
    assert_eq!(s.max_tokens, 8);
    for (t, p, msg) in [
        (-0.1, 1.0, "sampling.temperature must be >= 0"),
        (f32::NAN, 1.0, "sampling.temperature must be >= 0"),
        (1.0, 0.0, "sampling.top_p must be in (0, 1]"),
        (1.0, 1.5, "sampling.top_p must be in (0, 1]"),
    ] {
        let e = sampling(Some(&params(t, p))).unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::InvalidArgument, msg));
    }
    assert_eq!(
        sampling(None).unwrap_err().message(),
        "sampling is required"
    );
}

#[test]
fn sampling_carries_penalties_end_tokens_and_logprobs() {
    let wire = pb::SamplingParams {
        min_p: 0.1,
        repetition_penalty: Some(1.3),
        presence_penalty: -0.5,
        frequency_penalty: 0.5,
        ignore_eos: true,
        min_tokens: 3,
        stop_token_ids: vec![9, 10],
        logprobs: Some(4),
        ..params(0.7, 0.9)
    };
    let s = sampling(Some(&wire)).expect("valid");
    assert_eq!(
        (
            s.min_p,
            s.repetition_penalty,
            s.presence_penalty,
            s.frequency_penalty
        ),
        (0.1, 1.3, -0.5, 0.5)
    );
    assert!(s.ignore_eos);
    assert_eq!(
        (s.min_tokens, s.stop_token_ids.as_slice()),
        (3, &[9, 10][..])
    );
    assert_eq!(s.logprobs, Some(4));
    // Absent repetition penalty is off.
    let off = sampling(Some(&params(0.0, 1.0))).unwrap();
    assert_eq!((off.repetition_penalty, off.logprobs), (1.0, None));
    // The prompt ids are always required, all of them (decode recomputes from them).
    assert_eq!(prompt_ids(vec![1, 2], 2).unwrap(), [1, 2]);
    for short in [vec![], vec![1]] {
        assert_eq!(
            prompt_ids(short, 2).unwrap_err().code(),
            Code::InvalidArgument
        );
    }
    for bad in [
        pb::SamplingParams {
            repetition_penalty: Some(0.0),
            ..params(0.0, 1.0)
        },
        pb::SamplingParams {
            min_p: 1.5,
            ..params(0.0, 1.0)
        },
        pb::SamplingParams {
            frequency_penalty: f32::INFINITY,
            ..params(0.0, 1.0)
        },
        pb::SamplingParams {
            logprobs: Some(21),
            ..params(0.0, 1.0)
        },
    ] {
        assert_eq!(
            sampling(Some(&bad)).unwrap_err().code(),
            Code::InvalidArgument
        );
    }
}

#[test]
fn logprobs_round_trip_and_refuse_positive_values() {
    let l = TokenLogprobs {
        chosen: Logprob {
            token: 3,
            logprob: -0.25,
        },
        top: vec![Logprob {
            token: 3,
            logprob: -0.25,
        }],
    };
    let wire = logprobs(&l);
    assert_eq!(parse_logprobs(Some(&wire)).unwrap(), Some(l));
    assert_eq!(parse_logprobs(None).unwrap(), None);
    let mut bad = wire.clone();
    bad.top[0].logprob = 0.5;
    assert!(parse_logprobs(Some(&bad)).is_err());
    bad.chosen = None;
    assert!(parse_logprobs(Some(&bad)).is_err());
}

#[test]
fn logit_bias_is_sorted_by_token_and_bounded() {
    let mut p = params(0.0, 1.0);
    p.logit_bias = [(9, -100.0), (2, 100.0), (5, 0.25)].into_iter().collect();
    let s = sampling(Some(&p)).expect("in range");
    assert_eq!(s.logit_bias, vec![(2, 100.0), (5, 0.25), (9, -100.0)]);
    for bad in [100.5f32, -101.0, f32::NAN, f32::INFINITY] {
        let mut p = params(0.0, 1.0);
        p.logit_bias.insert(1, bad);
        let e = sampling(Some(&p)).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}");
        assert!(e.message().starts_with("sampling.logit_bias"), "{bad}");
    }
    let mut p = params(0.0, 1.0);
    p.logit_bias = (0..301).map(|t| (t, 1.0)).collect();
    assert!(sampling(Some(&p)).is_err(), "301 entries");
}

#[test]
fn regex_and_choice_grammars_are_parsed_and_empty_ones_refused() {
    use pagewarden_model::Grammar;
    use pb::sampling_params::Grammar as Wire;
    let with = |g: Wire| pb::SamplingParams {
        grammar: Some(g),
        ..params(0.0, 1.0)
    };
    let s = sampling(Some(&with(Wire::Regex("[0-9]+".into())))).expect("a regex");
    assert_eq!(s.grammar, Some(Grammar::Regex("[0-9]+".into())));
    let choices = pb::Choices {
        choices: vec!["a".into(), "b".into()],
    };
    let s = sampling(Some(&with(Wire::Choice(choices)))).expect("choices");
    assert_eq!(
        s.grammar,
        Some(Grammar::Choice(vec!["a".into(), "b".into()]))
    );
    let e = sampling(Some(&with(Wire::Regex(String::new())))).unwrap_err();
    assert_eq!(e.message(), "sampling.regex: must not be empty");
    let e = sampling(Some(&with(Wire::Choice(pb::Choices::default())))).unwrap_err();
    assert_eq!(
        e.message(),
        "sampling.choice: at least one text is required"
    );
}
