//! The request parts both workers parse: malformed ones become `INVALID_ARGUMENT` with a
//! message for the client.

use pagewarden_kvcache::Erasure;
use pagewarden_model::{Logprob, TokenLogprobs};
use pagewarden_proto::v1 as pb;
use pagewarden_worker::wire::{erase_reply, erase_request, logprobs, parse_logprobs, prompt_ids};
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

#[test]
fn an_erasure_needs_a_tenant_and_a_whole_namespace() {
    let ok = pb::EraseCacheRequest {
        namespace: vec![7; 32],
        tenant: "acme".into(),
    };
    let (tenant, namespace) = erase_request(ok.clone()).unwrap();
    assert_eq!((tenant.as_str(), namespace.as_bytes()), ("acme", &[7; 32]));
    for (bad, says) in [
        (
            pb::EraseCacheRequest {
                tenant: String::new(),
                ..ok.clone()
            },
            "tenant",
        ),
        (
            pb::EraseCacheRequest {
                namespace: vec![],
                ..ok.clone()
            },
            "namespace is required",
        ),
        (
            pb::EraseCacheRequest {
                namespace: vec![7; 31],
                ..ok.clone()
            },
            "31 bytes",
        ),
    ] {
        let e = erase_request(bad).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains(says), "{}", e.message());
    }
    let reply = erase_reply(
        "decode-0",
        "decode",
        &Erasure {
            entries: 3,
            pages_zeroed: 2,
            pages_deferred: 1,
            digest: [9; 32],
        },
    );
    assert_eq!(
        (reply.node_id.as_str(), reply.role.as_str(), reply.entries),
        ("decode-0", "decode", 3)
    );
    assert_eq!((reply.pages_zeroed, reply.pages_deferred), (2, 1));
    assert_eq!(reply.digest, vec![9; 32]);
}
