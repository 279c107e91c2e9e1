//! Prompts the system tests send: long, marked, and easy for a small model to continue.

use pagewarden_model::Tokenizer;

/// A prompt of about `tokens` tokens (never more) whose continuation is `code`: filler, then
/// the line `code: CODE` repeated, ending with `code:` (a small model copies the pattern).
pub fn marked_prompt(tok: &Tokenizer, code: &str, tokens: usize) -> String {
    const WORDS: [&str; 8] = [
        "river", "stone", "lamp", "orchard", "violet", "harbor", "meadow", "copper",
    ];
    let tail = format!("\ncode: {code}\ncode: {code}\ncode: {code}\ncode: {code}\ncode:");
    let head = format!("code: {code}\n");
    let mut words = tokens;
    loop {
        let filler: Vec<&str> = (0..words).map(|i| WORDS[i % WORDS.len()]).collect();
        let text = format!("{head}{}{tail}", filler.join(" "));
        let n = tok.encode(&text, true).len();
        if n <= tokens {
            return text;
        }
        words -= (n - tokens).div_ceil(2).max(1).min(words);
    }
}

/// A prompt of several whole KV pages about `topic` (distinct per topic): `notes` numbered
/// lines, then `Summary:`.
pub fn notes_prompt(topic: &str, notes: usize) -> String {
    let mut p = format!("Notes about {topic}.\n");
    for i in 0..notes {
        p.push_str(&format!(
            "Note {i}: the {topic} number {i} is filed under shelf {}.\n",
            i % 5
        ));
    }
    p.push_str("Summary:");
    p
}
