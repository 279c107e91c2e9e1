//! `Tokenizer`: built from GGUF metadata (`tokenizer.ggml.*`), matching llama.cpp's ids: special
//! tokens split out first, then either byte-level BPE (`gpt2`: the model's pre-tokenizer, then
//! ranked merges over GPT-2 byte stand-ins) or SentencePiece (`llama`: scored merges over
//! characters, byte fallback; `tokenizer_spm`). No BOS is ever added.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::OnceLock;

use crate::chat_guard::unguard;
use crate::constraint::{ConstraintError, Grammars};
use crate::gguf::{GgufError, GgufFile};
use crate::tokenizer_bpe::{merge_word, MergeRanks};
use crate::tokenizer_bytes::token_text_to_bytes;
use crate::tokenizer_pretok::PreTokenizer;
use crate::tokenizer_spm::SpmVocab;

/// Why a tokenizer could not be built from a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A metadata key is missing or has the wrong type.
    #[error(transparent)]
    Metadata(#[from] GgufError),
    /// `tokenizer.ggml.model` is not a supported tokenizer model.
    #[error("unsupported tokenizer model {0:?} (supported: gpt2, llama)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("unsupported pre-tokenizer {0:?}")]
    UnsupportedPre(String),
    /// The metadata is inconsistent (lengths differ, a byte has no token, ids out of range).
    #[error("invalid tokenizer metadata: {0}")]
    Invalid(String),
}

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// Ordinary text (type 1, and anything unrecognised).
    Normal,
    /// The unknown token (type 2).
    Unknown,
    /// A control token such as `<|im_start|>` (type 3): parsed only with `parse_special`,
    /// never rendered by `decode`.
    Control,
    /// A user-defined token (type 4): always parsed as a unit, rendered as its text.
    UserDefined,
    /// An unused slot (type 5).
    Unused,
    /// A raw byte token (type 6).
    Byte,
}

impl TokenKind {
    fn from_type(t: i32) -> TokenKind {
        match t {
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Normal,
        }
    }
}

/// Texts llama.cpp (llama-vocab.cpp) treats as end-of-generation wherever they appear in a
/// vocabulary, forcing them to control tokens.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// A byte-level BPE tokenizer. `Send + Sync`; share it by reference.
#[derive(Debug)]
pub struct Tokenizer {
    /// Each token's bytes (decoded stand-ins for text tokens, raw text for specials).
    pieces: Vec<Vec<u8>>,
    kinds: Vec<TokenKind>,
    /// Bytes → id for BPE lookups (last id wins, as in llama.cpp).
    by_bytes: HashMap<Vec<u8>, u32>,
    /// Token id of each single byte.
    byte_ids: [Option<u32>; 256],
    ranks: MergeRanks,
    pre: PreTokenizer,
    /// Set for SentencePiece vocabularies, which replace the BPE path.
    spm: Option<SpmVocab>,
    /// Control, user-defined and unknown tokens, longest text first.
    specials: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    /// The vocabulary indexed for constrained decoding, built by the first request that asks.
    grammars: OnceLock<Result<Grammars, ConstraintError>>,
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let md = f.metadata();
        let model = md.get_str("tokenizer.ggml.model")?;
        let spm_model = match model {
            "gpt2" => false,
            "llama" => true,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let pre_name = match md.get("tokenizer.ggml.pre") {
            Some(_) if !spm_model => md.get_str("tokenizer.ggml.pre")?,
            Some(_) | None => "gpt2",
        };
        let pre = PreTokenizer::from_name(pre_name)
            .ok_or_else(|| TokenizerError::UnsupportedPre(pre_name.to_string()))?;
        let texts = md.get_str_array("tokenizer.ggml.tokens")?;
        let n = texts.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(TokenizerError::Invalid(format!("{n} tokens")));
        }
        let types = match md.get("tokenizer.ggml.token_type") {
            Some(_) => md.get_i32_array("tokenizer.ggml.token_type")?,
            None => vec![1; n],
        };
        if types.len() != n {
            return Err(TokenizerError::Invalid(format!(
                "{} token types for {n} tokens",
                types.len()
            )));
        }
        let mut kinds: Vec<TokenKind> = types.iter().map(|&t| TokenKind::from_type(t)).collect();
        let mut eog = Vec::new();
        for (i, t) in texts.iter().enumerate() {
            if EOG_TEXTS.contains(&t.as_str()) {
                // llama.cpp forces these to CONTROL so they are never printed.
                kinds[i] = TokenKind::Control;
                eog.push(i as u32);
            }
        }
        // llama.cpp's exceptions: `</s>` is a normal token beside Gemma 4's and PLaMo's own end
        // markers; `<|end|>` is not an end (but user-defined) beside harmony's or Solar
        // Open's call/return markers.
        let has = |eog: &[u32], t: &str| eog.iter().any(|&i| texts[i as usize] == t);
        if has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>") {
            if let Some(j) = eog.iter().position(|&i| texts[i as usize] == "</s>") {
                kinds[eog.remove(j) as usize] = TokenKind::Normal;
            }
        }
        let call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
        if call && (has(&eog, "<|return|>") || has(&eog, "<|flush|>")) {
            if let Some(j) = eog.iter().position(|&i| texts[i as usize] == "<|end|>") {
                kinds[eog.remove(j) as usize] = TokenKind::UserDefined;
            }
        }
        let mut pieces = Vec::with_capacity(n);
        let mut by_bytes = HashMap::with_capacity(n);
        let mut by_text: HashMap<&str, u32> = HashMap::with_capacity(n);
        for (i, t) in texts.iter().enumerate() {
            let bytes = match (kinds[i], spm_model) {
                (TokenKind::Byte, true) => SpmVocab::byte_of(t)
                    .map(|b| vec![b])
                    .unwrap_or_else(|| t.as_bytes().to_vec()),
                (TokenKind::Normal | TokenKind::Unused, true) => SpmVocab::piece_bytes(t),
                (TokenKind::Normal | TokenKind::Unused | TokenKind::Byte, false) => {
                    token_text_to_bytes(t).unwrap_or_else(|| t.as_bytes().to_vec())
                }
                (TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown, _) => {
                    t.as_bytes().to_vec()
                }
            };
            if spm_model {
                by_bytes.insert(bytes.clone(), i as u32);
            } else if let Some(b) = token_text_to_bytes(t) {
                by_bytes.insert(b, i as u32);
            }
            by_text.insert(t.as_str(), i as u32);
            pieces.push(bytes);
        }
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = by_bytes.get(&[b as u8][..]).copied();
        }
        let ranks = match md.get("tokenizer.ggml.merges") {
            Some(_) => build_ranks(md.get_str_array("tokenizer.ggml.merges")?, &by_text),
            None => MergeRanks::new(),
        };
        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                matches!(
                    kinds[i as usize],
                    TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
                ) && !pieces[i as usize].is_empty()
            })
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(pieces[i as usize].len()));
        let id = |key: &str| -> Result<Option<u32>, TokenizerError> {
            match md.get(key) {
                None => Ok(None),
                Some(_) => {
                    let v = md.get_u32(key)?;
                    if (v as usize) < n {
                        Ok(Some(v))
                    } else {
                        Err(TokenizerError::Invalid(format!(
                            "{key} = {v} is out of range"
                        )))
                    }
                }
            }
        };
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let eos = id("tokenizer.ggml.eos_token_id")?;
        for extra in [
            eos,
            id("tokenizer.ggml.eot_token_id")?,
            id("tokenizer.ggml.eom_token_id")?,
        ]
        .into_iter()
        .flatten()
        {
            if !eog.contains(&extra) {
                eog.push(extra);
            }
        }
        // llama.cpp's defaults: SentencePiece (and some pre-tokenizers, Llama 3's among them)
        // add BOS unless the file says no; SentencePiece also adds a space prefix.
        let add_bos = md
            .get_bool("tokenizer.ggml.add_bos_token")
            .unwrap_or(spm_model || pre.adds_bos());
        let spm = if spm_model {
            let scores = md.get_f32_array("tokenizer.ggml.scores")?;
            let add_space_prefix = md
                .get_bool("tokenizer.ggml.add_space_prefix")
                .unwrap_or(true);
            Some(SpmVocab::new(texts, scores, add_space_prefix)?)
        } else {
            None
        };
        Ok(Tokenizer {
            pieces,
            kinds,
            by_bytes,
            byte_ids,
            ranks,
            pre,
            spm,
            specials,
            bos,
            eos,
            eog,
            add_bos,
            grammars: OnceLock::new(),
        })
    }

    /// Token ids for `text`; with `parse_special`, control tokens written in the text (e.g.
    /// `<|im_start|>`) become their ids. User-defined tokens are always parsed. No BOS.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.encode_fragments(text, parse_special, false)
    }

    /// A chat prompt rendered with guarded message content (`chat_guard`): control tokens
    /// are parsed, then the guards are removed from the text between them, so content that
    /// spells a control token is tokenized as text. BOS as [`Tokenizer::encode_prompt`].
    pub(crate) fn encode_guarded_prompt(&self, guarded: &str) -> Vec<u32> {
        self.with_bos(self.encode_fragments(guarded, true, true))
    }

    /// Texts of the tokens that `encode` parses only with `parse_special` (control and unknown
    /// tokens), the ones message content must not produce.
    pub fn control_texts(&self) -> impl Iterator<Item = &str> + Clone {
        self.specials
            .iter()
            .filter_map(|&id| match self.kinds[id as usize] {
                TokenKind::Control | TokenKind::Unknown => {
                    std::str::from_utf8(&self.pieces[id as usize]).ok()
                }
                TokenKind::Normal
                | TokenKind::UserDefined
                | TokenKind::Unused
                | TokenKind::Byte => None,
            })
    }

    fn encode_fragments(&self, text: &str, parse_special: bool, guarded: bool) -> Vec<u32> {
        let mut out = Vec::new();
        // SentencePiece prefixes a space to text that starts the input or follows a special.
        let mut after_special = true;
        for frag in self.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(t) => {
                    let t = if guarded {
                        unguard(t)
                    } else {
                        Cow::Borrowed(t)
                    };
                    match &self.spm {
                        Some(spm) => spm.tokenize(&t, after_special, &mut out),
                        None => self.encode_text(&t, &mut out),
                    }
                    after_special = false;
                }
            }
        }
        out
    }

    fn encode_text(&self, text: &str, out: &mut Vec<u32>) {
        let mut ids = Vec::new();
        for word in self.pre.split(text) {
            if self.pre.ignores_merges() {
                if let Some(&id) = self.by_bytes.get(word.as_bytes()) {
                    out.push(id);
                    continue;
                }
            }
            ids.clear();
            // Bytes without a token are dropped, as llama.cpp does.
            ids.extend(word.bytes().filter_map(|b| self.byte_ids[b as usize]));
            merge_word(&ids, &self.ranks, out);
        }
    }

    /// Splits `text` around special tokens, longest first, leftmost occurrence first.
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = vec![Fragment::Text(text)];
        for &id in &self.specials {
            let kind = self.kinds[id as usize];
            if !parse_special && matches!(kind, TokenKind::Control | TokenKind::Unknown) {
                continue;
            }
            // Special token texts are valid UTF-8 (they came from a GGUF string).
            let Ok(needle) = std::str::from_utf8(&self.pieces[id as usize]) else {
                continue;
            };
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                match f {
                    Fragment::Token(_) => next.push(f),
                    Fragment::Text(mut t) => {
                        while let Some(at) = t.find(needle) {
                            if at > 0 {
                                next.push(Fragment::Text(&t[..at]));
                            }
                            next.push(Fragment::Token(id));
                            t = &t[at + needle.len()..];
                        }
                        if !t.is_empty() {
                            next.push(Fragment::Text(t));
                        }
                    }
                }
            }
            frags = next;
        }
        frags
    }

    /// Text for `ids`: control tokens are skipped; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.piece(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes `id` contributes to decoded text (empty for control and unknown ids).
    pub fn piece(&self, id: u32) -> &[u8] {
        match self.kinds.get(id as usize) {
            Some(TokenKind::Control) | Some(TokenKind::Unknown) | None => &[],
            Some(_) => &self.pieces[id as usize],
        }
    }

    /// The token's bytes: decoded text for text tokens, the literal text for special tokens
    /// (e.g. `<|im_end|>`); empty for an out-of-range id.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// The id of a token whose bytes are exactly `bytes`, if any.
    pub fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        self.by_bytes.get(bytes).copied().or_else(|| {
            self.specials
                .iter()
                .copied()
                .find(|&i| self.pieces[i as usize] == bytes)
        })
    }

    /// The token's kind, or `None` for an out-of-range id.
    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// `tokenizer.ggml.bos_token_id`.
    pub fn bos_token(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id`.
    pub fn eos_token(&self) -> Option<u32> {
        self.eos
    }

    /// Whether the model asks for a BOS token (`tokenizer.ggml.add_bos_token`); `encode`
    /// never adds one, callers decide.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// A prompt's ids as llama.cpp feeds them to the model: BOS first when the model asks for
    /// it ([`Tokenizer::add_bos`]) and the text does not already start with it (a chat
    /// template may render it), then `encode(text, true)`.
    pub fn encode_prompt(&self, text: &str) -> Vec<u32> {
        self.with_bos(self.encode(text, true))
    }

    fn with_bos(&self, ids: Vec<u32>) -> Vec<u32> {
        match self.bos {
            Some(b) if self.add_bos && ids.first() != Some(&b) => {
                std::iter::once(b).chain(ids).collect()
            }
            _ => ids,
        }
    }

    /// Whether `id` ends generation: eos, eot, eom, and llama.cpp's list (`<|im_end|>`,
    /// `<|endoftext|>`, `<|eot_id|>`, …).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation ids.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// The vocabulary indexed for constrained decoding (built once, on first use).
    pub fn grammars(&self) -> Result<&Grammars, ConstraintError> {
        self.grammars
            .get_or_init(|| Grammars::new(self))
            .as_ref()
            .map_err(Clone::clone)
    }
}

enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// Merge ranks from `"left right"` lines; merges whose parts or result are not tokens are
/// skipped (they could never produce a token id).
fn build_ranks(merges: &[String], by_text: &HashMap<&str, u32>) -> MergeRanks {
    let mut ranks = MergeRanks::with_capacity(merges.len());
    for (rank, m) in merges.iter().enumerate() {
        // llama.cpp splits at the first space after the first character.
        let Some(sp) = m
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(i, _)| i)
        else {
            continue;
        };
        let (l, r) = (&m[..sp], &m[sp + 1..]);
        let merged = format!("{l}{r}");
        if let (Some(&a), Some(&b), Some(&c)) =
            (by_text.get(l), by_text.get(r), by_text.get(merged.as_str()))
        {
            ranks.entry((a, b)).or_insert((rank as u32, c));
        }
    }
    ranks
}
