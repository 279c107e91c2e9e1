//! Fuzz pass (bounded proptest): the transfer frame decoder never panics on arbitrary
//! or mutated input, and decoded frames re-encode to the bytes they came from. (The router's
//! request parsing is fuzzed in its own crate's tests, if at all: adding the router as a
//! dependency here re-features hyper/tower for this whole crate.)

use pagewarden_kvcache::{Generation, GrantKey, PageId};
use pagewarden_transfer::frame::{decode_from, encode, BatchId, Frame, WriteFrame, HEADER_LEN};
use proptest::prelude::*;

const MAX_PAYLOAD: usize = 4096;

fn valid_frame(kind: u8, key: [u8; 16], n: u64, data: &[u8]) -> Vec<u8> {
    let key = GrantKey(key);
    let f = match kind % 3 {
        0 => Frame::Write(WriteFrame {
            key,
            batch: BatchId(n),
            page: PageId(n as u32),
            generation: Generation(n),
            tokens: (n % 17) as u32,
            checksum: n,
            data,
        }),
        1 => Frame::BatchEnd {
            key,
            batch: BatchId(n),
            pages: n as u32,
        },
        _ => Frame::Drain(key),
    };
    let mut out = Vec::new();
    encode(&mut out, &f);
    out
}

/// Decodes every frame in `buf` until an error or a need for more bytes.
fn decode_all(buf: &[u8]) {
    let mut at = 0;
    while at < buf.len() {
        match decode_from(&buf[at..], MAX_PAYLOAD) {
            Ok(Some((f, used))) => {
                assert!(used >= HEADER_LEN && used <= buf.len() - at);
                let mut again = Vec::new();
                encode(&mut again, &f);
                assert_eq!(again, buf[at..at + used], "decode/encode round trip");
                at += used;
            }
            Ok(None) | Err(_) => return,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn frame_decoder_survives_arbitrary_bytes(buf in prop::collection::vec(any::<u8>(), 0..256)) {
        decode_all(&buf);
    }

    #[test]
    fn frame_decoder_survives_mutated_frames(
        kind in any::<u8>(), key in any::<[u8; 16]>(), n in any::<u64>(),
        data in prop::collection::vec(any::<u8>(), 0..64),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in any::<usize>(),
    ) {
        let mut buf = valid_frame(kind, key, n, &data);
        decode_all(&buf);
        for (at, x) in flips {
            let i = at % buf.len();
            buf[i] ^= x;
        }
        buf.truncate(cut % (buf.len() + 1));
        decode_all(&buf);
    }
}
