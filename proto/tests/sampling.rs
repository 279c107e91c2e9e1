//! Sampling parameters on the wire: what the router sends is what a worker parses, and a
//! worker refuses out-of-range values by the router's own rule (`SamplingParams::check`),
//! as `INVALID_ARGUMENT`.

use pagewarden_proto::convert::sampling;
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::sampling_params::Grammar as Wire;
use pagewarden_types::sampling::{Grammar, SamplingParams};
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
fn every_field_survives_the_round_trip() {
    let full = SamplingParams {
        temperature: 0.7,
        top_k: 5,
        top_p: 0.9,
        seed: Some(u64::MAX),
        max_tokens: 12,
        stop: vec!["\n\n".into(), "END".into()],
        min_p: 0.1,
        repetition_penalty: 1.3,
        presence_penalty: -0.5,
        frequency_penalty: 0.5,
        ignore_eos: true,
        min_tokens: 3,
        stop_token_ids: vec![9, 10],
        logprobs: Some(4),
        grammar: Some(Grammar::JsonSchema(serde_json::json!({"type": "object"}))),
        logit_bias: vec![(2, 100.0), (5, 0.25), (9, -100.0)],
        prompt_logprobs: Some(2),
    };
    let wire = pb::SamplingParams::from(&full);
    assert_eq!(sampling(Some(&wire)).unwrap(), full);
    for g in [
        Grammar::JsonObject,
        Grammar::Regex("[0-9]+".into()),
        Grammar::Choice(vec!["a".into(), "b".into()]),
    ] {
        let p = SamplingParams {
            grammar: Some(g),
            ..SamplingParams::greedy(3)
        };
        assert_eq!(sampling(Some(&pb::SamplingParams::from(&p))).unwrap(), p);
    }
    // A repetition penalty of 1 is off, and absent on the wire.
    let off = pb::SamplingParams::from(&SamplingParams::greedy(3));
    assert_eq!(off.repetition_penalty, None);
    assert_eq!(sampling(Some(&off)).unwrap().repetition_penalty, 1.0);
}

#[test]
fn out_of_range_values_are_refused_by_the_routers_rule() {
    for (t, p, msg) in [
        (
            -0.1,
            1.0,
            "sampling: `temperature` must be between 0 and 2, got -0.1",
        ),
        (
            f32::NAN,
            1.0,
            "sampling: `temperature` must be between 0 and 2, got NaN",
        ),
        (
            2.5,
            1.0,
            "sampling: `temperature` must be between 0 and 2, got 2.5",
        ),
        (1.0, 0.0, "sampling: `top_p` must be greater than 0"),
        (
            1.0,
            1.5,
            "sampling: `top_p` must be between 0 and 1, got 1.5",
        ),
    ] {
        let e = sampling(Some(&params(t, p))).unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::InvalidArgument, msg));
    }
    for bad in [
        pb::SamplingParams {
            repetition_penalty: Some(0.0),
            ..params(0.0, 1.0)
        },
        pb::SamplingParams {
            repetition_penalty: Some(11.0),
            ..params(0.0, 1.0)
        },
        pb::SamplingParams {
            min_p: 1.5,
            ..params(0.0, 1.0)
        },
        pb::SamplingParams {
            presence_penalty: 2.5,
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
        pb::SamplingParams {
            prompt_logprobs: Some(21),
            ..params(0.0, 1.0)
        },
        pb::SamplingParams {
            stop: vec![String::new()],
            ..params(0.0, 1.0)
        },
    ] {
        let e = sampling(Some(&bad)).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}");
    }
    assert_eq!(
        sampling(None).unwrap_err().message(),
        "sampling is required"
    );
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
        assert!(e.message().starts_with("sampling: `logit_bias`"), "{bad}");
    }
    let mut p = params(0.0, 1.0);
    p.logit_bias = (0..301).map(|t| (t, 1.0)).collect();
    assert!(sampling(Some(&p)).is_err(), "301 entries");
}

#[test]
fn malformed_and_empty_grammars_are_refused() {
    let with = |g: Wire| pb::SamplingParams {
        grammar: Some(g),
        ..params(0.0, 1.0)
    };
    for (g, msg) in [
        (
            Wire::Regex(String::new()),
            "sampling: `regex` must not be empty",
        ),
        (
            Wire::Choice(pb::Choices::default()),
            "sampling: `choice` must hold at least one text",
        ),
        (
            Wire::JsonObject(false),
            "sampling.json_object: must be true when set",
        ),
    ] {
        let e = sampling(Some(&with(g))).unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::InvalidArgument, msg));
    }
    let e = sampling(Some(&with(Wire::JsonSchema("{".into())))).unwrap_err();
    assert!(e.message().starts_with("sampling.json_schema: not JSON"));
}
