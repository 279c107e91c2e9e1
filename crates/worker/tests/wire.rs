//! The request parts both workers parse: malformed ones become `INVALID_ARGUMENT` with a
//! message for the client.

use pagewarden_model::{Logprob, TokenLogprobs};
use pagewarden_worker::wire::{logprobs, parse_logprobs, prompt_ids};
use tonic::Code;

#[test]
fn prompt_ids_are_required_all_of_them() {
    // Decode recomputes a preempted sequence from them.
    assert_eq!(prompt_ids(vec![1, 2], 2).unwrap(), [1, 2]);
    for short in [vec![], vec![1]] {
        assert_eq!(
            prompt_ids(short, 2).unwrap_err().code(),
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
