//! Constrained decoding for `response_format`: a JSON schema (or "any JSON object") compiled by
//! llguidance against the model's vocabulary into a per-request [`Constraint`], whose token mask
//! is applied to the logits before sampling (the grammar library llama.cpp and vLLM use).
//!
//! [`Grammars`] indexes the vocabulary once per model (a byte trie over every token; control
//! and unused tokens carry llguidance's special marker, so no grammar can spell them). A
//! [`Constraint`] is one request's parser state: [`Constraint::mask`] before each sample,
//! [`Constraint::accept`] after it. Once the grammar is complete only end-of-generation
//! tokens stay allowed, so a constrained answer is always a whole document, or cut by
//! `max_tokens` (finish reason `length`, as in vLLM).

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use pagewarden_types::sampling::Grammar;

use crate::tokenizer::{TokenKind, Tokenizer};

/// `text` as a regular expression matching exactly itself.
fn regex_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The llguidance grammar of `grammar`. Unless the schema says otherwise (its `x-guidance` key), JSON is
/// written with `", "` and `": "` between items and no other whitespace: with free
/// whitespace a small model can spend its whole budget on newlines and never close the
/// document.
fn top_level(grammar: &Grammar) -> TopLevelGrammar {
    let mut schema = match grammar {
        Grammar::JsonObject => serde_json::json!({"type": "object"}),
        Grammar::JsonSchema(s) => s.clone(),
        Grammar::Regex(rx) => return TopLevelGrammar::from_regex(rx),
        Grammar::Choice(choices) => {
            let alternatives: Vec<String> = choices.iter().map(|c| regex_literal(c)).collect();
            return TopLevelGrammar::from_regex(&format!("({})", alternatives.join("|")));
        }
    };
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    TopLevelGrammar::from_json_schema(schema)
}

/// Why a grammar cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// The vocabulary could not be indexed (a model defect).
    #[error("cannot index the vocabulary for constrained decoding: {0}")]
    Vocabulary(String),
    /// The schema or regular expression is not one llguidance compiles (its own message,
    /// verbatim).
    #[error("unsupported grammar: {0}")]
    Schema(String),
}

/// A model's vocabulary indexed for constrained decoding; built once, shared by requests.
pub struct Grammars {
    factory: ParserFactory,
    /// The model's end-of-generation tokens: allowed exactly when the grammar may end.
    eog: Vec<u32>,
    /// The token llguidance treats as end of sequence (one of `eog`).
    eos: u32,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("eog", &self.eog).finish()
    }
}

impl Grammars {
    /// Indexes `tok`'s vocabulary.
    pub fn new(tok: &Tokenizer) -> Result<Self, ConstraintError> {
        let eog = tok.eog_tokens().to_vec();
        let eos = tok
            .eos_token()
            .filter(|e| eog.contains(e))
            .or_else(|| eog.first().copied())
            .ok_or_else(|| ConstraintError::Vocabulary("the model has no end token".into()))?;
        let words: Vec<Vec<u8>> = (0..tok.vocab_size() as u32)
            .map(|id| match tok.kind(id) {
                Some(TokenKind::Normal | TokenKind::Byte | TokenKind::UserDefined) => {
                    tok.token_bytes(id).to_vec()
                }
                // Never text: marked so that no grammar matches them.
                _ => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tok.token_bytes(id));
                    w
                }
            })
            .collect();
        let info = TokRxInfo::new(tok.vocab_size() as u32, eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory, eog, eos })
    }

    /// A fresh constraint for one request, or why `grammar` cannot be compiled.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, ConstraintError> {
        let parser = self
            .factory
            .create_parser(top_level(grammar))
            .map_err(|e| ConstraintError::Schema(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Schema(e));
        }
        Ok(Constraint {
            matcher: Some(matcher),
            eog: self.eog.clone(),
            eos: self.eos,
        })
    }
}

/// One request's position in its grammar.
#[derive(Clone)]
pub struct Constraint {
    /// `None`: the grammar could not be compiled where it was checked before (the router and
    /// each worker check it at admission), so only end tokens are allowed: an empty answer,
    /// never an unconstrained one.
    matcher: Option<Matcher>,
    eog: Vec<u32>,
    eos: u32,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.as_ref().map(Matcher::is_stopped))
            .finish()
    }
}

impl Constraint {
    /// The constraint of `grammar` for a model with end tokens `eog`, or one that ends the
    /// output at once when the grammar does not compile (see [`Grammars::compile`], which
    /// admission uses to refuse such a request with the reason).
    pub fn for_tokenizer(tok: &Tokenizer, grammar: &Grammar) -> Self {
        match tok.grammars().and_then(|g| g.compile(grammar)) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "constrained decoding: grammar unusable, ending the output");
                let eog = tok.eog_tokens().to_vec();
                Constraint {
                    matcher: None,
                    eos: eog.first().copied().unwrap_or(0),
                    eog,
                }
            }
        }
    }

    /// Sets every token the grammar does not allow next to `-inf`. When the grammar is
    /// complete (or its parser failed) only end-of-generation tokens remain.
    pub fn mask(&mut self, logits: &mut [f32]) {
        let Some(matcher) = &mut self.matcher else {
            self.only_end(logits);
            return;
        };
        let allowed = match matcher.compute_mask_or_eos() {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "constrained decoding: parser error, ending the output");
                self.only_end(logits);
                return;
            }
        };
        let end = allowed.is_allowed(self.eos);
        for (id, l) in logits.iter_mut().enumerate() {
            let id = id as u32;
            let ok = if self.eog.contains(&id) {
                end
            } else {
                allowed.is_allowed(id)
            };
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Advances past `token` (sampled under [`Constraint::mask`], or by the other worker).
    /// An end token, or a token the grammar refuses, stops the constraint: from then on only
    /// end tokens are allowed.
    pub fn accept(&mut self, token: u32) {
        if self.eog.contains(&token) {
            return;
        }
        let Some(matcher) = &mut self.matcher else {
            return;
        };
        if let Err(e) = matcher.consume_token(token) {
            tracing::warn!(error = %e, "constrained decoding: parser error, ending the output");
        }
    }

    /// Whether the output so far is a complete document.
    pub fn is_complete(&mut self) -> bool {
        self.matcher
            .as_mut()
            .is_none_or(|m| m.is_stopped() || m.is_accepting().unwrap_or(false))
    }

    fn only_end(&self, logits: &mut [f32]) {
        for (id, l) in logits.iter_mut().enumerate() {
            if !self.eog.contains(&(id as u32)) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::{tiny_llama_gguf, GgufFile, Sampler, SamplingParams};

    fn tiny() -> Tokenizer {
        let file = GgufFile::from_bytes(tiny_llama_gguf(3)).expect("the tiny model");
        Tokenizer::from_gguf(&file).expect("its tokenizer")
    }

    /// Samples under `grammar` at temperature 1 over random logits until an end token.
    fn sample(tok: &Tokenizer, grammar: &Grammar, seed: u64) -> String {
        let p = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            grammar: Some(grammar.clone()),
            ..SamplingParams::default()
        };
        let mut sampler = Sampler::for_model(&p, &[], tok);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut ids = Vec::new();
        for _ in 0..64 {
            let logits: Vec<f32> = (0..tok.vocab_size())
                .map(|_| rng.random_range(-4.0..4.0))
                .collect();
            let t = sampler.sample(&logits);
            if tok.eog_tokens().contains(&t) {
                return tok.decode(&ids);
            }
            ids.push(t);
        }
        panic!("no end after 64 tokens: {:?}", tok.decode(&ids));
    }

    #[test]
    fn a_choice_yields_exactly_one_of_its_texts_even_with_regex_characters() {
        let tok = tiny();
        let choices = vec!["yes".to_string(), "no (a.b)".into(), "1+1=2?".into()];
        let grammar = Grammar::Choice(choices.clone());
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..24 {
            let text = sample(&tok, &grammar, seed);
            assert!(choices.contains(&text), "seed {seed}: {text:?}");
            seen.insert(text);
        }
        assert!(seen.len() > 1, "random logits picked only {seen:?}");
    }

    #[test]
    fn a_regex_is_matched_whole_and_a_bad_one_is_refused() {
        let tok = tiny();
        let grammar = Grammar::Regex("[a-c]{2}-[0-9]{3}".into());
        for seed in 0..12 {
            let text = sample(&tok, &grammar, seed);
            let b = text.as_bytes();
            let shape = b.len() == 6
                && b[..2].iter().all(|c| (b'a'..=b'c').contains(c))
                && b[2] == b'-'
                && b[3..].iter().all(u8::is_ascii_digit);
            assert!(shape, "seed {seed}: {text:?}");
        }
        let grammars = tok.grammars().expect("the tiny vocabulary indexes");
        assert!(grammars
            .compile(&Grammar::Regex("(unclosed".into()))
            .is_err());
        assert_eq!(regex_literal("a.b|c"), "a\\.b\\|c");
    }
}
