//! Turning sampled tokens into stream events, with exactly the single-process engine's rules:
//! an end token (`EndTokens`: end-of-generation unless `ignore_eos`, and `stop_token_ids`)
//! ends the stream (and is not part of the completion), a stop sequence ends it before the stop
//! text (held back while it may still form), `max_tokens` ends it with `length`. Text is
//! released as complete UTF-8 only.

use std::sync::Arc;

use pagewarden_model::{
    EndTokens, FinishReason, SamplingParams, StopMatcher, StopOutcome, Tokenizer,
};

/// What one accepted token produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// The token.
    pub token: u32,
    /// Text released by this token.
    pub text: String,
    /// Set when the sequence ends with this token.
    pub finish: Option<FinishReason>,
    /// The token is an end token (see `EndTokens`) and not part of the completion.
    pub end_of_generation: bool,
}

/// Incremental detokenizer over an owned tokenizer handle: decodes the whole completion and
/// releases the new suffix, holding back a trailing incomplete UTF-8 sequence.
struct Detok {
    tokenizer: Arc<Tokenizer>,
    tokens: Vec<u32>,
    released: usize,
}

impl Detok {
    fn push(&mut self, token: u32) -> String {
        self.tokens.push(token);
        let full = self.tokenizer.decode(&self.tokens);
        let mut end = full.len();
        if full.ends_with('\u{FFFD}') {
            end -= '\u{FFFD}'.len_utf8();
        }
        self.release(&full, end)
    }

    fn finish(&mut self) -> String {
        let full = self.tokenizer.decode(&self.tokens);
        let end = full.len();
        self.release(&full, end)
    }

    fn release(&mut self, full: &str, end: usize) -> String {
        if end <= self.released
            || !full.is_char_boundary(self.released)
            || !full.is_char_boundary(end)
        {
            return String::new();
        }
        let out = full[self.released..end].to_string();
        self.released = end;
        out
    }
}

/// Per-sequence output state.
pub struct Output {
    max_tokens: usize,
    generated: usize,
    detok: Detok,
    stop: StopMatcher,
    end: EndTokens,
}

impl Output {
    pub fn new(tokenizer: Arc<Tokenizer>, p: &SamplingParams) -> Self {
        Self {
            max_tokens: p.max_tokens,
            generated: 0,
            end: EndTokens::new(p, tokenizer.eog_tokens()),
            detok: Detok {
                tokenizer,
                tokens: Vec::new(),
                released: 0,
            },
            stop: StopMatcher::new(&p.stop),
        }
    }

    /// Accepts the next sampled token (the same control flow as `Engine::generate_streaming`).
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
    use super::*;
    use pagewarden_model::GgufFile;

    fn tokenizer() -> Arc<Tokenizer> {
        let f = GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(3)).unwrap();
        Arc::new(Tokenizer::from_gguf(&f).unwrap())
    }

    #[test]
    fn length_stop_and_end_of_generation() {
        let tok = tokenizer();
        let ids = tok.encode("hello world", false);
        assert!(ids.len() >= 2);
        let mut out = Output::new(tok.clone(), &SamplingParams::greedy(ids.len()));
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
        let mut out = Output::new(tok.clone(), &with_stop);
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
        let mut out = Output::new(tok.clone(), &SamplingParams::greedy(100));
        let e = out.push(eog);
        assert!(e.end_of_generation);
        assert_eq!(e.finish, Some(FinishReason::Stop));

        // ignore_eos: the end-of-generation token is ordinary; a stop token id ends instead.
        let p = SamplingParams {
            ignore_eos: true,
            stop_token_ids: vec![ids[0]],
            ..SamplingParams::greedy(100)
        };
        let mut out = Output::new(tok, &p);
        assert_eq!(out.push(eog).finish, None);
        let e = out.push(ids[0]);
        assert!(e.end_of_generation);
        assert_eq!(e.finish, Some(FinishReason::Stop));
    }
}
