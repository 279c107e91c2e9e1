//! Token logprobs in OpenAI's two shapes: chat `logprobs.content[]` (`token`, `logprob`,
//! `bytes`, `top_logprobs[]`) and the legacy completions object (`tokens`, `token_logprobs`,
//! `top_logprobs`, `text_offset`). The values are the decode worker's log-softmax of the raw
//! logits (see `pagewarden_model::logprobs`). A token's text is its bytes as the tokenizer holds
//! them (special tokens spelled out) read as UTF-8, invalid bytes replaced; `bytes` are exact.

use pagewarden_model::Tokenizer;
use pagewarden_proto::v1::{Logprobs, TokenLogprob};
use serde_json::{json, Map, Value};

use crate::openai::Endpoint;

/// Renders the logprobs of one response, chunk by chunk: the completions `text_offset` runs on
/// across calls.
#[derive(Debug)]
pub struct LogprobsRenderer {
    endpoint: Endpoint,
    /// Characters of token text rendered so far.
    offset: usize,
}

impl LogprobsRenderer {
    /// A renderer for a response of `endpoint`.
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            offset: 0,
        }
    }

    /// The legacy completions `logprobs` of an echoed prompt and its completion: the prompt's
    /// tokens first (the first with null logprobs: nothing precedes it), `prompt_items` for
    /// the others, then the completion's `items`.
    pub fn render_echo(
        &mut self,
        tok: &Tokenizer,
        prompt: &[u32],
        prompt_items: &[Logprobs],
        items: &[Logprobs],
    ) -> Value {
        let Some(&first) = prompt.first() else {
            return self.render(tok, items);
        };
        let first_text = String::from_utf8_lossy(tok.token_bytes(first)).into_owned();
        self.offset = first_text.chars().count();
        let all: Vec<Logprobs> = prompt_items.iter().chain(items).cloned().collect();
        let mut v = self.render(tok, &all);
        let arrays = [
            ("tokens", json!(first_text)),
            ("token_logprobs", Value::Null),
            ("top_logprobs", Value::Null),
            ("text_offset", json!(0)),
        ];
        for (key, head) in arrays {
            if let Some(a) = v[key].as_array_mut() {
                a.insert(0, head);
            }
        }
        v
    }

    /// The `logprobs` value of a choice holding `items` (one per completion token, in order).
    pub fn render(&mut self, tok: &Tokenizer, items: &[Logprobs]) -> Value {
        let text = |id: u32| String::from_utf8_lossy(tok.token_bytes(id)).into_owned();
        let chosen = |l: &Logprobs| l.chosen.as_ref().cloned().unwrap_or_default();
        match self.endpoint {
            Endpoint::Chat => {
                let entry = |l: &TokenLogprob| {
                    json!({
                        "token": text(l.token),
                        "logprob": l.logprob,
                        "bytes": tok.token_bytes(l.token),
                    })
                };
                let content: Vec<Value> = items
                    .iter()
                    .map(|l| {
                        let mut e = entry(&chosen(l));
                        e["top_logprobs"] = l.top.iter().map(entry).collect();
                        e
                    })
                    .collect();
                json!({ "content": content })
            }
            Endpoint::Completions => {
                let mut tokens = Vec::with_capacity(items.len());
                let mut offsets = Vec::with_capacity(items.len());
                for l in items {
                    let t = text(chosen(l).token);
                    offsets.push(self.offset);
                    self.offset += t.chars().count();
                    tokens.push(t);
                }
                let top: Vec<Value> = items
                    .iter()
                    .map(|l| {
                        // Tokens with the same text share a key: the most likely one keeps it.
                        let mut dict = Map::new();
                        for t in &l.top {
                            dict.entry(text(t.token)).or_insert(json!(t.logprob));
                        }
                        Value::Object(dict)
                    })
                    .collect();
                json!({
                    "tokens": tokens,
                    "token_logprobs": items.iter().map(|l| chosen(l).logprob).collect::<Vec<_>>(),
                    "top_logprobs": top,
                    "text_offset": offsets,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewarden_model::GgufFile;

    fn lp(token: u32, logprob: f32, top: &[(u32, f32)]) -> Logprobs {
        let one = |(token, logprob): (u32, f32)| TokenLogprob { token, logprob };
        Logprobs {
            chosen: Some(one((token, logprob))),
            top: top.iter().copied().map(one).collect(),
        }
    }

    #[test]
    fn both_shapes_and_offsets_that_run_across_chunks() {
        let f = GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(3)).unwrap();
        let tok = Tokenizer::from_gguf(&f).unwrap();
        let ids = tok.encode("hello world", false);
        let (a, b) = (ids[0], ids[1]);
        let items = [lp(a, -0.5, &[(a, -0.5), (b, -1.5)]), lp(b, -0.25, &[])];

        let chat = LogprobsRenderer::new(Endpoint::Chat).render(&tok, &items);
        let c = &chat["content"];
        assert_eq!(c[0]["logprob"], json!(-0.5));
        assert_eq!(c[0]["bytes"], json!(tok.token_bytes(a)));
        assert_eq!(c[0]["top_logprobs"][1]["logprob"], json!(-1.5));
        assert_eq!(c[1]["top_logprobs"], json!([]));

        let mut r = LogprobsRenderer::new(Endpoint::Completions);
        let first = r.render(&tok, &items[..1]);
        let second = r.render(&tok, &items[1..]);
        let len_a = String::from_utf8_lossy(tok.token_bytes(a)).chars().count();
        assert_eq!(first["text_offset"], json!([0]));
        assert_eq!(second["text_offset"], json!([len_a]));
        assert_eq!(second["token_logprobs"], json!([-0.25]));
        assert_eq!(first["top_logprobs"][0].as_object().map(Map::len), Some(2));
    }
}
