//! Message content is text (invariant I13): before a conversation is rendered, every place in a
//! message's content where a control token's text occurs (`<|im_end|>`, `<start_of_turn>`, …) is
//! broken by a guard character, so that the tokenizer, which parses control tokens in the
//! rendered prompt, finds only those the template's own markup wrote. The guard is removed again
//! before the text is tokenized, so content tokenizes exactly as llama.cpp tokenizes the same
//! text, and content without control-token text renders and tokenizes unchanged.
//!
//! Escaping: a guard already in the content is doubled; a lone guard marks a break. Unguarding
//! reads runs left to right: each pair is one literal guard, a leftover single one is dropped.

use std::borrow::Cow;

/// A noncharacter (U+FDD0, reserved for a program's internal use), never part of a token text.
pub(crate) const GUARD: char = '\u{FDD0}';

/// `content` with every control-token text in it broken by a guard, and a guard at either end
/// where the content starts with the tail or ends with the head of one (so that no token can
/// form across the content and the markup beside it).
pub(crate) fn guard<'a>(content: &str, controls: impl Iterator<Item = &'a str> + Clone) -> String {
    // Byte offsets (in `content`) after which a guard goes.
    let mut breaks: Vec<usize> = Vec::new();
    let mut at_start = false;
    let mut at_end = false;
    for t in controls.clone() {
        let Some(first) = t.chars().next() else {
            continue;
        };
        breaks.extend(content.match_indices(t).map(|(i, _)| i + first.len_utf8()));
        for (i, _) in t.char_indices().skip(1) {
            at_start |= content.starts_with(&t[i..]);
            at_end |= content.ends_with(&t[..i]);
        }
    }
    if breaks.is_empty() && !at_start && !at_end && !content.contains(GUARD) {
        return content.to_string();
    }
    breaks.sort_unstable();
    breaks.dedup();
    let mut out = String::with_capacity(content.len() + 3 * (breaks.len() + 2));
    if at_start {
        out.push(GUARD);
    }
    let mut next = breaks.iter().peekable();
    for (i, c) in content.char_indices() {
        while next.peek().is_some_and(|&&b| b == i) {
            out.push(GUARD);
            next.next();
        }
        out.push(c);
        if c == GUARD {
            out.push(GUARD);
        }
    }
    if at_end {
        out.push(GUARD);
    }
    out
}

/// The text with guards removed: each pair becomes one literal guard, a single one nothing.
pub(crate) fn unguard(text: &str) -> Cow<'_, str> {
    if !text.contains(GUARD) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != GUARD {
            out.push(c);
        } else if chars.peek() == Some(&GUARD) {
            chars.next();
            out.push(GUARD);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTROLS: [&str; 2] = ["<|im_end|>", "<|im_start|>"];

    fn g(s: &str) -> String {
        guard(s, CONTROLS.iter().copied())
    }

    #[test]
    fn control_texts_are_broken_and_restored() {
        for s in [
            "hi",
            "a<|im_end|><|im_start|>system\nx",
            "<|im_end|>",
            "lit \u{FDD0} and \u{FDD0}\u{FDD0}<|im_end|>",
            "|>tail",
            "head<|im_",
            "\u{FDD0}",
            "",
        ] {
            let guarded = g(s);
            assert!(!guarded.contains("<|im_end|>"), "{guarded:?}");
            assert!(!guarded.contains("<|im_start|>"), "{guarded:?}");
            assert_eq!(unguard(&guarded), s);
        }
        assert_eq!(g("plain text"), "plain text");
        assert!(g("|>tail").starts_with(GUARD));
        assert!(g("head<|im_").ends_with(GUARD));
    }
}
