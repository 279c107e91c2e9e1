//! The request parts both workers parse: malformed ones become `INVALID_ARGUMENT` with a
//! message for the client.

use pagewarden_proto::v1 as pb;
use pagewarden_worker::wire::{request_ref, sampling};
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
fn request_ref_needs_a_16_byte_id() {
    let ok = pb::RequestRef {
        request_id: vec![7; 16],
        attempt: 2,
    };
    let (_, attempt) = request_ref(Some(&ok)).expect("valid");
    assert_eq!(attempt.0, 2);
    let short = pb::RequestRef {
        request_id: vec![7; 15],
        attempt: 0,
    };
    let e = request_ref(Some(&short)).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "req.request_id must be 16 bytes");
    assert_eq!(request_ref(None).unwrap_err().message(), "req is required");
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
