//! `TokenOutput`: the one set of rules that turns sampled tokens into a completion's text and
//! its end, for the single-process engine and for decode alike. An end token (`EndTokens`:
//! end-of-generation unless `ignore_eos`, and `stop_token_ids`) ends the completion and is not
//! part of it; a stop sequence ends it before the stop text (held back while it may still form);
//! `max_tokens` ends it with `length`. Text is released as complete UTF-8 only
//! ([`StreamDecoder`]), so each token costs its own bytes, not the completion's length.

use std::ops::Deref;

use crate::sampling::EndTokens;
use crate::stop::{StopMatcher, StopOutcome};
use crate::tokenizer::Tokenizer;
use crate::tokenizer_stream::StreamDecoder;
use crate::SamplingParams;
use pagewarden_types::FinishReason;

/// What one accepted token produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// The token.
    pub token: u32,
    /// Text released by this token.
    pub text: String,
    /// Set when the completion ends with this token.
    pub finish: Option<FinishReason>,
    /// The token is an end token (see [`EndTokens`]) and not part of the completion.
    pub end_of_generation: bool,
}

/// One completion's output state, over a borrowed or shared tokenizer.
#[derive(Debug)]
pub struct TokenOutput<T: Deref<Target = Tokenizer>> {
    max_tokens: usize,
    generated: usize,
    detok: StreamDecoder<T>,
    stop: StopMatcher,
    end: EndTokens,
}

impl<T: Deref<Target = Tokenizer>> TokenOutput<T> {
    /// The output of a completion sampled with `p`.
    pub fn new(tokenizer: T, p: &SamplingParams) -> Self {
        TokenOutput {
            max_tokens: p.max_tokens,
            generated: 0,
            end: EndTokens::new(p, tokenizer.eog_tokens()),
            detok: StreamDecoder::new(tokenizer),
            stop: StopMatcher::new(&p.stop),
        }
    }

    /// Completion tokens accepted so far (end tokens are not counted).
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Accepts the next sampled token.
    pub fn push(&mut self, token: u32) -> Emitted {
        if self.end.contains(token) {
            let text = self.detok.finish() + &self.stop.finish();
            return Emitted {
                token,
                text,
                finish: Some(FinishReason::Stop),
                end_of_generation: true,
            };
        }
        self.generated += 1;
        let (mut text, stopped) = match self.stop.push(&self.detok.push(token)) {
            StopOutcome::Continue(s) => (s, false),
            StopOutcome::Stop(s) => (s, true),
        };
        if stopped {
            return Emitted {
                token,
                text,
                finish: Some(FinishReason::Stop),
                end_of_generation: false,
            };
        }
        if self.generated >= self.max_tokens {
            let tail = self.detok.finish();
            match self.stop.push(&tail) {
                StopOutcome::Continue(s) => {
                    text.push_str(&s);
                    text.push_str(&self.stop.finish());
                }
                StopOutcome::Stop(s) => text.push_str(&s),
            }
            return Emitted {
                token,
                text,
                finish: Some(FinishReason::Length),
                end_of_generation: false,
            };
        }
        Emitted {
            token,
            text,
            finish: None,
            end_of_generation: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{tiny_llama_gguf, GgufFile};

    fn tokenizer() -> Arc<Tokenizer> {
        let f = GgufFile::from_bytes(tiny_llama_gguf(3)).unwrap();
        Arc::new(Tokenizer::from_gguf(&f).unwrap())
    }

    #[test]
    fn length_stop_and_end_of_generation() {
        let tok = tokenizer();
        let ids = tok.encode("hello world", false);
        assert!(ids.len() >= 2);
        let mut out = TokenOutput::new(tok.clone(), &SamplingParams::greedy(ids.len()));
        let mut text = String::new();
        for (i, &t) in ids.iter().enumerate() {
            let e = out.push(t);
            text.push_str(&e.text);
            assert_eq!(e.finish.is_some(), i + 1 == ids.len());
        }
        assert_eq!(text, "hello world");

        let with_stop = SamplingParams {
            stop: vec!["wor".into()],
            ..SamplingParams::greedy(100)
        };
        let mut out = TokenOutput::new(&*tok, &with_stop);
        let text: String = ids
            .iter()
            .map(|&t| out.push(t))
            .take_while(|e| e.finish.is_none())
            .map(|e| e.text)
            .collect();
        assert!(!text.contains("wor"), "{text:?}");

        let eog = *tok
            .eog_tokens()
            .first()
            .expect("an end-of-generation token");
        let mut out = TokenOutput::new(tok.clone(), &SamplingParams::greedy(100));
        let e = out.push(eog);
        assert!(e.end_of_generation);
        assert_eq!(e.finish, Some(FinishReason::Stop));
        assert_eq!(out.generated(), 0);

        // ignore_eos: the end-of-generation token is ordinary; a stop token id ends instead.
        let p = SamplingParams {
            ignore_eos: true,
            stop_token_ids: vec![ids[0]],
            ..SamplingParams::greedy(100)
        };
        let mut out = TokenOutput::new(tok, &p);
        assert_eq!(out.push(eog).finish, None);
        let e = out.push(ids[0]);
        assert!(e.end_of_generation);
        assert_eq!(e.finish, Some(FinishReason::Stop));
    }

    #[test]
    fn text_split_across_tokens_is_released_whole_and_equals_the_decoded_completion() {
        let tok = tokenizer();
        let text = "caf\u{e9} \u{1f600} na\u{ef}ve \u{4e2d}\u{6587}";
        let ids = tok.encode(text, false);
        let mut out = TokenOutput::new(tok.clone(), &SamplingParams::greedy(1000));
        let (mut got, mut held) = (String::new(), 0);
        for &t in &ids {
            // Every piece released is whole UTF-8 (a String could not hold less).
            let e = out.push(t);
            held += usize::from(e.text.is_empty());
            got.push_str(&e.text);
        }
        assert!(
            held > 0,
            "no character was split across tokens: the test shows nothing"
        );
        let eog = *tok.eog_tokens().first().unwrap();
        got.push_str(&out.push(eog).text);
        assert_eq!(got, tok.decode(&ids));
    }
}
