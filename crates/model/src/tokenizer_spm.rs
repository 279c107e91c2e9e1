//! SentencePiece-style tokenization (`tokenizer.ggml.model = "llama"`), as llama.cpp does it:
//! spaces become `▁`, the text splits into UTF-8 characters, and the adjacent pair whose joined
//! text is the highest-scoring token is merged first (ties: leftmost) until no pair forms a
//! token. A leftover character without a token falls back to its bytes (`<0xXX>` tokens).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::tokenizer::TokenizerError;

/// The vocabulary as the SentencePiece merge needs it.
#[derive(Debug)]
pub(crate) struct SpmVocab {
    /// Raw token text (with `▁`) → id; the last id wins, as in llama.cpp.
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    /// Token of each byte: `<0xXX>`, else the one-byte text.
    byte_ids: [Option<u32>; 256],
    /// Prepend a space to text that starts the input or follows a special token.
    pub(crate) add_space_prefix: bool,
}

/// One symbol of the text being merged: a byte range, linked to its live neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of `left` and `right` (a max-heap entry: best score, then leftmost).
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// The character SentencePiece writes for a space.
const SPACE: &str = "\u{2581}";

impl SpmVocab {
    /// Builds the merge tables from the token texts and `tokenizer.ggml.scores`.
    pub(crate) fn new(
        texts: &[String],
        scores: Vec<f32>,
        add_space_prefix: bool,
    ) -> Result<SpmVocab, TokenizerError> {
        if scores.len() != texts.len() {
            return Err(TokenizerError::Invalid(format!(
                "{} scores for {} tokens",
                scores.len(),
                texts.len()
            )));
        }
        let mut ids = HashMap::with_capacity(texts.len());
        for (i, t) in texts.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
        }
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = ids.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
                // A byte that is valid UTF-8 on its own may be spelled as itself.
                std::str::from_utf8(&[b as u8])
                    .ok()
                    .and_then(|s| ids.get(s).copied())
            });
        }
        Ok(SpmVocab {
            ids,
            scores,
            byte_ids,
            add_space_prefix,
        })
    }

    /// The byte a `<0xXX>` token stands for.
    pub(crate) fn byte_of(text: &str) -> Option<u8> {
        let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
        (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
    }

    /// The bytes a normal token's text decodes to (`▁` is a space).
    pub(crate) fn piece_bytes(text: &str) -> Vec<u8> {
        text.replace(SPACE, " ").into_bytes()
    }

    /// Appends the tokens of one raw-text fragment. `space_prefix`: this fragment starts the
    /// input or follows a special token (a space is prepended when the vocabulary asks).
    pub(crate) fn tokenize(&self, text: &str, space_prefix: bool, out: &mut Vec<u32>) {
        let mut escaped = String::with_capacity(text.len() + 3);
        if self.add_space_prefix && space_prefix {
            escaped.push(' ');
        }
        escaped.push_str(text);
        let text = escaped.replace(' ', SPACE);
        if text.is_empty() {
            return;
        }
        let mut symbols: Vec<Symbol> = Vec::new();
        for (i, (start, c)) in text.char_indices().enumerate() {
            let end = start + c.len_utf8();
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: (end < text.len()).then_some(i + 1),
            });
        }
        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.push_bigram(&text, &symbols, i - 1, i, &mut queue);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // One side already merged into something else: a stale candidate.
            if l.len == 0 || r.len == 0 || l.len + r.len != b.len {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.right].len = 0;
            symbols[b.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            if let Some(p) = symbols[b.left].prev {
                self.push_bigram(&text, &symbols, p, b.left, &mut queue);
            }
            if let Some(n) = symbols[b.left].next {
                self.push_bigram(&text, &symbols, b.left, n, &mut queue);
            }
        }
        let mut at = Some(0);
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                // Every merge formed a token, so only single characters get here.
                None => out.extend(piece.bytes().filter_map(|b| self.byte_ids[b as usize])),
            }
            at = s.next;
        }
    }

    fn push_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (l, r) = (symbols[left], symbols[right]);
        let joined = &text[l.start..r.start + r.len];
        if let Some(&id) = self.ids.get(joined) {
            queue.push(Bigram {
                left,
                right,
                score: self.scores[id as usize],
                len: joined.len(),
            });
        }
    }
}
