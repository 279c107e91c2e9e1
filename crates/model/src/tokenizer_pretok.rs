//! Pre-tokenizers: split text into words before BPE, reproducing llama.cpp's splitting
//! (`llama-vocab.cpp`, `unicode.cpp`) for the `tokenizer.ggml.pre` names it maps to these patterns:
//! - GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`, optionally
//!   after isolating every `\p{N}` code point (starcoder, smollm, …);
//! - Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//!   (Qwen2's differs only in taking one digit at a time);
//! - Tekken (Mistral Nemo, Mistral Small 3): words split at lower→upper case changes,
//!   `[^\r\n\p{L}\p{N}]?[\p{Lu}…]*[\p{Ll}…]+|[^\r\n\p{L}\p{N}]?[\p{Lu}…]+[\p{Ll}…]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//!   as llama.cpp runs it: every non-ASCII letter counts as both cases.
//!
//! Mistral v0.1–v0.3 and Phi-3 ship SentencePiece vocabularies (`tokenizer.ggml.model = llama`),
//! which have no pre-tokenizer.

use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

/// The splitting pattern of a pre-tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// The GPT-2 pattern alone.
    Gpt2,
    /// Every number code point on its own, then the GPT-2 pattern.
    DigitsThenGpt2,
    /// The Llama 3 pattern (numbers of up to three digits).
    Llama3,
    /// The Llama 3 pattern with single digits.
    Qwen2,
    /// Mistral's Tekken pattern.
    Tekken,
}

/// How text is split into words before BPE merges, and what llama.cpp sets beside the pattern
/// for the same `tokenizer.ggml.pre` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreTokenizer {
    pattern: Pattern,
    /// Words that are whole tokens skip merging (llama.cpp's `ignore_merges`).
    ignore_merges: bool,
    /// BOS is added when the file does not say (`tokenizer.ggml.add_bos_token` absent).
    add_bos: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value, or `None` if this
    /// crate does not implement it.
    pub fn from_name(pre: &str) -> Option<PreTokenizer> {
        let (pattern, ignore_merges, add_bos) = match pre {
            // `gpt2` is not a llama.cpp name; it stands for a file without `tokenizer.ggml.pre`.
            "gpt2" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en"
            | "jina-v2-code" | "roberta-bpe" | "exaone4" | "mpt" | "olmo" | "jais" | "trillion"
            | "granite-docling" => (Pattern::Gpt2, false, false),
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => (Pattern::DigitsThenGpt2, false, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => (Pattern::Llama3, true, true),
            "dbrx" | "smaug-bpe" => (Pattern::Llama3, false, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2"
            | "hunyuan" | "solar-open" => (Pattern::Qwen2, false, false),
            "tekken" => (Pattern::Tekken, true, true),
            _ => return None,
        };
        Some(PreTokenizer {
            pattern,
            ignore_merges,
            add_bos,
        })
    }

    /// The splitting pattern.
    pub fn pattern(self) -> Pattern {
        self.pattern
    }

    /// Splits `text` into words (substrings that concatenate back to `text`).
    pub fn split(self, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        match self.pattern {
            Pattern::Gpt2 => gpt2_split(text, &mut out),
            Pattern::DigitsThenGpt2 => {
                for piece in split_numbers(text) {
                    gpt2_split(piece, &mut out);
                }
            }
            Pattern::Llama3 => llama3_split(text, 3, &mut out),
            Pattern::Qwen2 => llama3_split(text, 1, &mut out),
            Pattern::Tekken => tekken_split(text, &mut out),
        }
        out
    }

    /// Whether a word that is already a token is emitted without merging.
    pub fn ignores_merges(self) -> bool {
        self.ignore_merges
    }

    /// Whether llama.cpp adds BOS for this pre-tokenizer when the file does not say.
    pub fn adds_bos(self) -> bool {
        self.add_bos
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
}

fn class(c: char) -> Class {
    // White_Space is checked first, as llama.cpp's flags do (`\s` wins over categories).
    if c.is_whitespace() {
        return Class::Space;
    }
    match c.general_category_group() {
        GeneralCategoryGroup::Letter => Class::Letter,
        GeneralCategoryGroup::Number => Class::Number,
        GeneralCategoryGroup::Mark
        | GeneralCategoryGroup::Punctuation
        | GeneralCategoryGroup::Symbol
        | GeneralCategoryGroup::Separator
        | GeneralCategoryGroup::Other => Class::Other,
    }
}

fn is_number(c: char) -> bool {
    !c.is_whitespace() && c.general_category_group() == GeneralCategoryGroup::Number
}

/// Isolates each number code point: "ab12c" → "ab", "1", "2", "c".
fn split_numbers(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in text.char_indices() {
        if is_number(c) {
            if start < i {
                out.push(&text[start..i]);
            }
            out.push(&text[i..i + c.len_utf8()]);
            start = i + c.len_utf8();
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// The GPT-2 pattern over one fragment, matched by hand the way llama.cpp's custom splitter
/// does (lowercase-only contractions; a lone space attaches to the following run).
fn gpt2_split<'t>(text: &'t str, out: &mut Vec<&'t str>) {
    let cps: Vec<(usize, char)> = text.char_indices().collect();
    let n = cps.len();
    let at = |i: usize| cps.get(i).map(|&(_, c)| c);
    let cls = |i: usize| at(i).map(class);
    let byte = |i: usize| cps.get(i).map_or(text.len(), |&(b, _)| b);
    let mut pos = 0;
    let emit = |from: usize, to: usize, out: &mut Vec<&'t str>| {
        if to > from {
            out.push(&text[byte(from)..byte(to)]);
        }
    };
    while pos < n {
        let c = cps[pos].1;
        // 's|'t|'re|'ve|'m|'ll|'d
        if c == '\'' {
            let (a, b) = (at(pos + 1), at(pos + 2));
            let len = match (a, b) {
                (Some('s' | 't' | 'm' | 'd'), _) => 2,
                (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => 3,
                _ => 0,
            };
            if len > 0 {
                emit(pos, pos + len, out);
                pos += len;
                continue;
            }
        }
        // ` ?X+` for X in letters, numbers, and "other" (not space, letter or number).
        let lead = if c == ' ' { cls(pos + 1) } else { cls(pos) };
        if let Some(k @ (Class::Letter | Class::Number | Class::Other)) = lead {
            let start = pos;
            if c == ' ' {
                pos += 1;
            }
            while cls(pos) == Some(k) {
                pos += 1;
            }
            emit(start, pos, out);
            continue;
        }
        // \s+(?!\S) then \s+
        let mut ws = 0;
        while cls(pos + ws) == Some(Class::Space) {
            ws += 1;
        }
        if ws > 1 && pos + ws < n {
            emit(pos, pos + ws - 1, out);
            pos += ws - 1;
        } else if ws > 0 {
            emit(pos, pos + ws, out);
            pos += ws;
        } else {
            emit(pos, pos + 1, out);
            pos += 1;
        }
    }
}

/// The Llama 3 pattern, matched by hand as llama.cpp's custom splitter does
/// (case-insensitive contractions, `max_digits` numbers per word).
fn llama3_split<'t>(text: &'t str, max_digits: usize, out: &mut Vec<&'t str>) {
    let cps: Vec<(usize, char)> = text.char_indices().collect();
    let n = cps.len();
    let at = |i: usize| cps.get(i).map(|&(_, c)| c);
    let cls = |i: usize| at(i).map(class);
    let byte = |i: usize| cps.get(i).map_or(text.len(), |&(b, _)| b);
    let is_nl = |i: usize| matches!(at(i), Some('\r' | '\n'));
    let emit = |from: usize, to: usize, out: &mut Vec<&'t str>| {
        if to > from {
            out.push(&text[byte(from)..byte(to)]);
        }
    };
    let mut pos = 0;
    while pos < n {
        let start = pos;
        let c = cps[pos].1;
        if c == '\'' {
            let lower = |i: usize| at(i).map(|c| c.to_ascii_lowercase());
            let len = match (lower(pos + 1), lower(pos + 2)) {
                (Some('s' | 't' | 'm' | 'd'), _) => 2,
                (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => 3,
                _ => 0,
            };
            if len > 0 {
                emit(pos, pos + len, out);
                pos += len;
                continue;
            }
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(c == '\r' || c == '\n' || cls(pos) == Some(Class::Number))
            && (cls(pos) == Some(Class::Letter) || cls(pos + 1) == Some(Class::Letter))
        {
            pos += 1;
            while cls(pos) == Some(Class::Letter) {
                pos += 1;
            }
            emit(start, pos, out);
            continue;
        }
        // \p{N}{1,max}
        if cls(pos) == Some(Class::Number) {
            while cls(pos) == Some(Class::Number) && pos - start < max_digits {
                pos += 1;
            }
            emit(start, pos, out);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        let lead = if c == ' ' { cls(pos + 1) } else { cls(pos) };
        if lead == Some(Class::Other) {
            if c == ' ' {
                pos += 1;
            }
            while cls(pos) == Some(Class::Other) {
                pos += 1;
            }
            while is_nl(pos) {
                pos += 1;
            }
            emit(start, pos, out);
            continue;
        }
        let mut ws = 0;
        let mut last_nl = None;
        while cls(pos + ws) == Some(Class::Space) {
            if is_nl(pos + ws) {
                last_nl = Some(pos + ws + 1);
            }
            ws += 1;
        }
        if let Some(end) = last_nl {
            // \s*[\r\n]+
            pos = end;
        } else if ws > 1 && pos + ws < n {
            // \s+(?!\S)
            pos += ws - 1;
        } else if ws > 0 {
            pos += ws;
        } else {
            pos += 1;
        }
        emit(start, pos, out);
    }
}

/// Mistral's Tekken pattern as llama.cpp's std::regex runs it over "collapsed" text, where
/// every non-ASCII letter is one byte outside `a-z` and `A-Z`: such a letter is both an
/// "upper" (`[^a-z]` letter) and a "lower" (`[^A-Z]` letter). Alternatives are tried in order,
/// each with the backtracking an ECMAScript regex does.
fn tekken_split<'t>(text: &'t str, out: &mut Vec<&'t str>) {
    let cps: Vec<(usize, char)> = text.char_indices().collect();
    let n = cps.len();
    let at = |i: usize| cps.get(i).map(|&(_, c)| c);
    let cls = |i: usize| at(i).map(class);
    let byte = |i: usize| cps.get(i).map_or(text.len(), |&(b, _)| b);
    let is_nl = |i: usize| matches!(at(i), Some('\r' | '\n'));
    let letter = |i: usize| cls(i) == Some(Class::Letter);
    let upper = |i: usize| letter(i) && !at(i).is_some_and(|c| c.is_ascii_lowercase());
    let lower = |i: usize| letter(i) && !at(i).is_some_and(|c| c.is_ascii_uppercase());
    // [^\r\n\p{L}\p{N}]
    let lead = |i: usize| !is_nl(i) && matches!(cls(i), Some(Class::Space | Class::Other));
    let mut pos = 0;
    while pos < n {
        let start = pos;
        let q = if lead(pos) { pos + 1 } else { pos };
        // [^\r\n\p{L}\p{N}]?U*L+ : the longest U* that still leaves an L after it.
        let mut j = q;
        while upper(j) {
            j += 1;
        }
        if let Some(k) = (q..=j).rev().find(|&k| lower(k)) {
            pos = k;
            while lower(pos) {
                pos += 1;
            }
            out.push(&text[byte(start)..byte(pos)]);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?U+L*
        if j > q {
            pos = j;
            while lower(pos) {
                pos += 1;
            }
            out.push(&text[byte(start)..byte(pos)]);
            continue;
        }
        // \p{N}
        if cls(pos) == Some(Class::Number) {
            pos += 1;
            out.push(&text[byte(start)..byte(pos)]);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
        let c = cps[pos].1;
        let first = if c == ' ' { pos + 1 } else { pos };
        if cls(first) == Some(Class::Other) {
            pos = first;
            while cls(pos) == Some(Class::Other) {
                pos += 1;
            }
            while is_nl(pos) || at(pos) == Some('/') {
                pos += 1;
            }
            out.push(&text[byte(start)..byte(pos)]);
            continue;
        }
        let mut ws = 0;
        let mut last_nl = None;
        while cls(pos + ws) == Some(Class::Space) {
            if is_nl(pos + ws) {
                last_nl = Some(pos + ws + 1);
            }
            ws += 1;
        }
        if let Some(end) = last_nl {
            pos = end;
        } else if ws > 1 && pos + ws < n {
            pos += ws - 1;
        } else if ws > 0 {
            pos += ws;
        } else {
            pos += 1;
        }
        out.push(&text[byte(start)..byte(pos)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pre(name: &str) -> PreTokenizer {
        PreTokenizer::from_name(name).unwrap()
    }

    fn split(t: &str) -> Vec<&str> {
        pre("smollm").split(t)
    }

    #[test]
    fn gpt2_pattern_cases() {
        assert_eq!(split("Hello world"), ["Hello", " world"]);
        assert_eq!(
            split("I'm here, it's"),
            ["I", "'m", " here", ",", " it", "'s"]
        );
        assert_eq!(split("a  b"), ["a", " ", " b"]);
        assert_eq!(split("a   \n"), ["a", "   \n"]);
        assert_eq!(split("x\n\ny"), ["x", "\n", "\n", "y"]);
        assert_eq!(split("  def f():"), [" ", " def", " f", "():"]);
        assert_eq!(split("abc123"), ["abc", "1", "2", "3"]);
        assert_eq!(split("x 12"), ["x", " ", "1", "2"]);
        assert_eq!(split("日本語のテキスト。"), ["日本語のテキスト", "。"]);
        assert_eq!(pre("gpt-2").split("x 12"), ["x", " 12"]);
        assert_eq!(split("'S"), ["'", "S"]);
    }

    #[test]
    fn llama3_pattern_cases() {
        let l3 = |t| pre("llama-bpe").split(t);
        assert_eq!(l3("Hello world"), ["Hello", " world"]);
        assert_eq!(l3("I'LL 12345"), ["I", "'LL", " ", "123", "45"]);
        assert_eq!(l3("(hi)!!\n\nx"), ["(hi", ")!!\n\n", "x"]);
        assert_eq!(l3("a \n  b"), ["a", " \n", " ", " b"]);
        assert_eq!(l3("a   b"), ["a", "  ", " b"]);
        assert_eq!(pre("qwen2").split("x123"), ["x", "1", "2", "3"]);
    }

    #[test]
    fn tekken_pattern_cases() {
        let t = |s| pre("tekken").split(s);
        assert_eq!(t("HelloWorld"), ["Hello", "World"]);
        assert_eq!(t("HTTPServer"), ["HTTPServer"]);
        assert_eq!(t("getHTTP x"), ["get", "HTTP", " x"]);
        assert_eq!(t(" été12"), [" été", "1", "2"]);
        assert_eq!(t("a //b\n"), ["a", " //", "b", "\n"]);
        assert_eq!(t("éA"), ["é", "A"]);
        assert_eq!(t("I'm"), ["I", "'m"]);
    }

    #[test]
    fn names_map_as_llama_cpp_does() {
        assert!(pre("llama-bpe").ignores_merges() && pre("llama-bpe").adds_bos());
        assert!(!pre("dbrx").ignores_merges());
        assert_eq!(pre("dbrx").pattern(), Pattern::Llama3);
        assert_eq!(pre("deepseek-r1-qwen").pattern(), Pattern::Qwen2);
        assert!(!pre("qwen2").ignores_merges() && !pre("qwen2").adds_bos());
        assert_eq!(pre("tekken").pattern(), Pattern::Tekken);
        assert!(PreTokenizer::from_name("qwen35").is_none());
    }
}
