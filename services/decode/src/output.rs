//! Turning sampled tokens into stream events: end-of-generation, `max_tokens`, stop sequences
//! (text held back while it may still become a stop sequence) and incremental UTF-8 text.

use std::sync::Arc;

use pagewarden_model::Tokenizer;

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// End-of-generation token or stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
}

/// What one accepted token produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// The token.
    pub token: u32,
    /// Text released by this token.
    pub text: String,
    /// Set when the sequence ends with this token.
    pub finish: Option<Finish>,
    /// The token is an end-of-generation marker and not part of the completion.
    pub end_of_generation: bool,
}

/// Per-sequence output state.
pub struct Output {
    tokenizer: Arc<Tokenizer>,
    max_tokens: usize,
    stop: Vec<String>,
    tokens: Vec<u32>,
    /// Bytes of the decoded text already released to the client.
    released: usize,
}

impl Output {
    pub fn new(tokenizer: Arc<Tokenizer>, max_tokens: usize, stop: Vec<String>) -> Self {
        let stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
        Self {
            tokenizer,
            max_tokens,
            stop,
            tokens: Vec::new(),
            released: 0,
        }
    }

    /// Accepts the next sampled token.
    pub fn push(&mut self, token: u32) -> Emitted {
        let tok = &self.tokenizer;
        if tok.is_eog(token) {
            return Emitted {
                token,
                text: self.flush(),
                finish: Some(Finish::Stop),
                end_of_generation: true,
            };
        }
        self.tokens.push(token);
        let full = tok.decode(&self.tokens);
        let length = self.tokens.len() >= self.max_tokens;
        // Find a stop sequence starting at or after the text already released... or straddling it.
        if let Some(cut) = self.stop_cut(&full) {
            let text = full.get(self.released..cut).unwrap_or("").to_string();
            self.released = cut.max(self.released);
            return Emitted {
                token,
                text,
                finish: Some(Finish::Stop),
                end_of_generation: false,
            };
        }
        if length {
            let text = full.get(self.released..).unwrap_or("").to_string();
            self.released = full.len();
            return Emitted {
                token,
                text,
                finish: Some(Finish::Length),
                end_of_generation: false,
            };
        }
        // Hold back an incomplete UTF-8 sequence (decoded as U+FFFD) and any suffix that may
        // still grow into a stop sequence.
        let mut end = full.len();
        if full.ends_with('\u{FFFD}') {
            end -= '\u{FFFD}'.len_utf8();
        }
        end = end.min(full.len() - self.held_suffix(&full));
        let end = end.max(self.released);
        let text = full.get(self.released..end).unwrap_or("").to_string();
        self.released = end;
        Emitted {
            token,
            text,
            finish: None,
            end_of_generation: false,
        }
    }

    fn flush(&mut self) -> String {
        let full = self.tokenizer.decode(&self.tokens);
        let text = full.get(self.released..).unwrap_or("").to_string();
        self.released = full.len();
        text
    }

    /// Byte index where the earliest stop sequence begins, if one occurs in the unreleased tail.
    fn stop_cut(&self, full: &str) -> Option<usize> {
        let longest = self.stop.iter().map(String::len).max()?;
        let mut from = self.released.saturating_sub(longest);
        while !full.is_char_boundary(from) {
            from -= 1;
        }
        self.stop
            .iter()
            .filter_map(|s| full[from..].find(s.as_str()).map(|i| from + i))
            .min()
    }

    /// Length of the longest suffix of `full` that is a proper prefix of a stop sequence.
    fn held_suffix(&self, full: &str) -> usize {
        let mut best = 0;
        for s in &self.stop {
            for (i, _) in s.char_indices().skip(1) {
                if i > best && full.ends_with(&s[..i]) {
                    best = i;
                }
            }
        }
        best
    }
}
