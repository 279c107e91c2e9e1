//! Tokenizer on the tiny model's vocabulary: merges, specials, round trips, streaming.

use pagewarden_model::{tiny_llama_gguf, GgufFile, StreamDecoder, TokenKind, Tokenizer};
use proptest::prelude::*;

fn tok() -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::from_bytes(tiny_llama_gguf(0)).unwrap()).unwrap()
}

#[test]
fn merges_and_specials() {
    let t = tok();
    let hello = t.token_id(b" hello").expect("merged token");
    let world = t.token_id(b" world").expect("merged token");
    assert_eq!(t.encode(" hello world", false), [hello, world]);
    let ids = t.encode("<|im_start|>user\n hello<|im_end|>", true);
    assert_eq!(ids[0], 1);
    assert_eq!(*ids.last().unwrap(), 2);
    assert!(ids.contains(&hello));
    // Without parse_special the markers are plain text.
    let plain = t.encode("<|im_start|>", false);
    assert!(plain.len() > 1 && !plain.contains(&1));
    assert_eq!(t.decode(&plain), "<|im_start|>");
    assert_eq!(t.kind(1), Some(TokenKind::Control));
    assert!(t.is_eog(2) && !t.is_eog(1));
    assert_eq!(t.eos_token(), Some(2));
    // Control tokens are not rendered.
    assert_eq!(t.decode(&ids), "user\n hello");
    assert_eq!(t.token_bytes(2), b"<|im_end|>");
    // Digits are split one by one (smollm pre-tokenizer), so "12" is never merged.
    assert_eq!(t.encode("12", false).len(), 2);
}

#[test]
fn stream_decoder_holds_split_characters() {
    let t = tok();
    let ids = t.encode("é日本", false);
    assert_eq!(ids.len(), "é日本".len(), "no merges: one token per byte");
    let mut d = StreamDecoder::new(&t);
    let pieces: Vec<String> = ids.iter().map(|&i| d.push(i)).collect();
    assert_eq!(pieces[0], "");
    assert_eq!(pieces[1], "é");
    assert_eq!(pieces.concat(), "é日本");
    assert!(d.pending().is_empty());
    // A lone continuation byte is invalid forever: replaced, not held.
    let cont = t.token_id(&[0x80]).unwrap();
    assert_eq!(d.push(cont), "\u{FFFD}");
    let lead = t.token_id(&[0xE6]).unwrap();
    assert_eq!(d.push(lead), "");
    assert_eq!(d.finish(), "\u{FFFD}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn round_trips_any_text(s in "\\PC{0,40}") {
        let t = tok();
        let ids = t.encode(&s, false);
        prop_assert_eq!(t.decode(&ids), s.clone());
        let mut d = StreamDecoder::new(&t);
        let streamed: String = ids.iter().map(|&i| d.push(i)).collect();
        prop_assert_eq!(streamed, s);
    }
}
