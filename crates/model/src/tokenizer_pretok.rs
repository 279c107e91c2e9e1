//! Pre-tokenizers: split text into words before BPE, reproducing llama.cpp's splitting for the
//! `tokenizer.ggml.pre` types it maps to the GPT-2 pattern
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`, optionally after
//! isolating every `\p{N}` code point (starcoder, smollm, …).

use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

/// How text is split into words before BPE merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// The GPT-2 pattern alone (`gpt2`, `mpt`, `olmo`, `jais`).
    Gpt2,
    /// Every number code point on its own, then the GPT-2 pattern (`starcoder`, `refact`,
    /// `command-r`, `smollm`, `codeshell`, `exaone`, `minerva-7b`).
    DigitsThenGpt2,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value, or `None` if unsupported.
    pub fn from_name(pre: &str) -> Option<PreTokenizer> {
        match pre {
            "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" => Some(PreTokenizer::Gpt2),
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" => Some(PreTokenizer::DigitsThenGpt2),
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
        }
        out
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
}
