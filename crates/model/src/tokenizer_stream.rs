//! `StreamDecoder`: turns a stream of token ids into text pieces that are always complete
//! UTF-8, holding back the bytes of a character split across tokens.

use std::ops::Deref;

use crate::Tokenizer;

/// Incremental detokenizer for one sequence, over a borrowed (`&Tokenizer`) or shared
/// (`Arc<Tokenizer>`) tokenizer. Each token costs its own bytes, whatever came before.
#[derive(Debug)]
pub struct StreamDecoder<T: Deref<Target = Tokenizer>> {
    tok: T,
    pending: Vec<u8>,
}

impl<T: Deref<Target = Tokenizer>> StreamDecoder<T> {
    /// A decoder with nothing pending.
    pub fn new(tok: T) -> Self {
        StreamDecoder {
            tok,
            pending: Vec::new(),
        }
    }

    /// Adds one token and returns the text that is now complete (possibly empty). Bytes that
    /// can never become valid UTF-8 come out as U+FFFD.
    pub fn push(&mut self, id: u32) -> String {
        self.pending.extend_from_slice(self.tok.piece(id));
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // valid_up_to marks a UTF-8 boundary, so this cannot fail.
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or(""));
                    match e.error_len() {
                        // An incomplete character at the end: keep it for the next token.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: whatever is held back, as lossy text.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
