//! Response bodies in OpenAI's shapes: completion and chat objects, their streaming chunks, the
//! usage object, and the model list.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use pagewarden_model::FinishReason;

/// Which endpoint a response belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

impl Endpoint {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
        }
    }

    /// The field a too-long prompt is blamed on.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Endpoint::Completions => "prompt",
            Endpoint::Chat => "messages",
        }
    }
}

/// `usage`: token counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (the tokenizer's count).
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// The sum.
    pub total_tokens: u32,
    /// Of the prompt tokens, those served from the prefix cache.
    #[serde(default)]
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`, as OpenAI's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the tenant's prefix cache instead of being computed.
    pub cached_tokens: u32,
}

impl Usage {
    /// Builds the sum.
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// What every body of one response shares.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    /// `cmpl-…` or `chatcmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
    /// Which endpoint.
    pub endpoint: Endpoint,
}

impl ResponseMeta {
    /// Meta for request `id` (hex) at the current time.
    pub fn new(endpoint: Endpoint, request_hex: &str, model: &str) -> Self {
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Self {
            id: format!("{prefix}-{request_hex}"),
            created,
            model: model.to_string(),
            endpoint,
        }
    }

    /// One choice of a complete (non-streaming) body; `logprobs` is null unless requested. A
    /// chat reply that called tools carries `tool_calls` (and `content` null when it wrote
    /// nothing else).
    pub fn choice(
        &self,
        index: usize,
        text: &str,
        tool_calls: &[Value],
        finish: FinishReason,
        logprobs: Value,
    ) -> Value {
        match self.endpoint {
            Endpoint::Completions => json!({
                "index": index, "text": text, "logprobs": logprobs,
                "finish_reason": finish.as_str(),
            }),
            Endpoint::Chat => {
                let message = if tool_calls.is_empty() {
                    json!({"role": "assistant", "content": text})
                } else {
                    let content = (!text.is_empty()).then_some(text);
                    json!({"role": "assistant", "content": content, "tool_calls": tool_calls})
                };
                json!({
                    "index": index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish.as_str(),
                })
            }
        }
    }

    /// The complete (non-streaming) body of these choices.
    pub fn full(&self, choices: Vec<Value>, usage: Usage) -> Value {
        json!({
            "id": self.id,
            "object": match self.endpoint {
                Endpoint::Completions => "text_completion",
                Endpoint::Chat => "chat.completion",
            },
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        })
    }

    /// One streaming chunk of choice `index` carrying `text` and the `logprobs` of its tokens
    /// (null unless requested); `first` adds the assistant role to a chat delta.
    pub fn chunk(
        &self,
        index: usize,
        text: &str,
        finish: Option<FinishReason>,
        first: bool,
        logprobs: Value,
    ) -> Value {
        let finish = finish.map(FinishReason::as_str);
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
            }),
            Endpoint::Chat => {
                let delta = if first {
                    json!({"role": "assistant", "content": text})
                } else {
                    json!({"content": text})
                };
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        self.chunk_with(vec![choice], None)
    }

    /// A chat chunk of choice `index` whose delta holds the reply's tool calls (each with its
    /// own `index`), whole.
    pub fn tool_calls_chunk(&self, index: usize, calls: &[Value]) -> Value {
        let choice = json!({
            "index": index,
            "delta": {"tool_calls": crate::tools::delta_calls(calls)},
            "logprobs": null,
            "finish_reason": null,
        });
        self.chunk_with(vec![choice], None)
    }

    /// The final usage chunk (`stream_options.include_usage`): no choices, only usage.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        self.chunk_with(Vec::new(), Some(usage))
    }

    /// A stream's last chunk before `[DONE]` when the request asked for a receipt: no
    /// choices, the signed receipt as `pagewarden_receipt`.
    pub fn receipt_chunk(&self, receipt: Value) -> Value {
        let mut v = self.chunk_with(Vec::new(), None);
        v["pagewarden_receipt"] = receipt;
        v
    }

    fn chunk_with(&self, choices: Vec<Value>, usage: Option<Usage>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": match self.endpoint {
                Endpoint::Completions => "text_completion",
                Endpoint::Chat => "chat.completion.chunk",
            },
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = json!(u);
        }
        v
    }
}

/// `GET /v1/models`: the served model with its effective context (`null` while no worker is live).
pub fn model_list(model: &str, max_model_len: Option<u32>) -> Value {
    json!({
        "object": "list",
        "data": [model_object(model, max_model_len)],
    })
}

/// One model as `GET /v1/models/{id}` (and each entry of the list) describes it.
pub fn model_object(model: &str, max_model_len: Option<u32>) -> Value {
    json!({
        "id": model,
        "object": "model",
        "created": 0,
        "owned_by": "pagewarden",
        "max_model_len": max_model_len,
    })
}
