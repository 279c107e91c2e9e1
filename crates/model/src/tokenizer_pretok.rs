//! Pre-tokenizers: split text into words before BPE, reproducing llama.cpp's splitting for the
//! `tokenizer.ggml.pre` types it maps to the GPT-2 pattern
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`, optionally after
//! isolating every `\p{N}` code point (starcoder, smollm, …), and the Llama 3 pattern
//! `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//! (Qwen2's differs only in taking one digit at a time).

use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

/// How text is split into words before BPE merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// The GPT-2 pattern alone (`gpt2`, `mpt`, `olmo`, `jais`).
    Gpt2,
    /// Every number code point on its own, then the GPT-2 pattern (`starcoder`, `refact`,
    /// `command-r`, `smollm`, `codeshell`, `exaone`, `minerva-7b`).
    DigitsThenGpt2,
    /// The Llama 3 pattern (`llama3`, `llama-v3`, `llama-bpe`, `falcon3`, `pixtral`); words
    /// that are whole tokens skip merging (llama.cpp's `ignore_merges`).
    Llama3,
    /// The Llama 3 pattern with single digits (`qwen2`, `deepseek-r1-qwen`, `megrez`).
    Qwen2,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value, or `None` if unsupported.
    pub fn from_name(pre: &str) -> Option<PreTokenizer> {
        match pre {
            "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" => Some(PreTokenizer::Gpt2),
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" => Some(PreTokenizer::DigitsThenGpt2),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => {
                Some(PreTokenizer::Llama3)
            }
            "qwen2" | "deepseek-r1-qwen" | "megrez" => Some(PreTokenizer::Qwen2),
            _ => None,
        }
    }

    /// Splits `text` into words (substrings that concatenate back to `text`).
    pub fn split(self, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        match self {
            PreTokenizer::Gpt2 => gpt2_split(text, &mut out),
            PreTokenizer::DigitsThenGpt2 => {
                for piece in split_numbers(text) {
                    gpt2_split(piece, &mut out);
                }
            }
            PreTokenizer::Llama3 => llama3_split(text, 3, &mut out),
            PreTokenizer::Qwen2 => llama3_split(text, 1, &mut out),
        }
        out
    }

    /// Whether a word that is already a token is emitted without merging.
    pub fn ignores_merges(self) -> bool {
        self == PreTokenizer::Llama3
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

#[cfg(test)]
mod tests {
    use super::*;

    fn split(t: &str) -> Vec<&str> {
        PreTokenizer::DigitsThenGpt2.split(t)
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
        assert_eq!(PreTokenizer::Gpt2.split("x 12"), ["x", " 12"]);
        assert_eq!(split("'S"), ["'", "S"]);
    }

    #[test]
    fn llama3_pattern_cases() {
        let l3 = |t| PreTokenizer::Llama3.split(t);
        assert_eq!(l3("Hello world"), ["Hello", " world"]);
        assert_eq!(l3("I'LL 12345"), ["I", "'LL", " ", "123", "45"]);
        assert_eq!(l3("(hi)!!\n\nx"), ["(hi", ")!!\n\n", "x"]);
        assert_eq!(l3("a \n  b"), ["a", " \n", " ", " b"]);
        assert_eq!(l3("a   b"), ["a", "  ", " b"]);
        assert_eq!(PreTokenizer::Qwen2.split("x123"), ["x", "1", "2", "3"]);
    }
}
