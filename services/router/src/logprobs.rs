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
                        let dict: Map<String, Value> = l
                            .top
                            .iter()
                            .map(|t| (text(t.token), json!(t.logprob)))
                            .collect();
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
