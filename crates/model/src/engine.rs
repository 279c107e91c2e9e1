//! `Engine`: single-process generation (prefill, then decode one token at a time) over pages
//! from a local `KvPool`. Services that split prefill and decode use `Model` directly.

use std::sync::Arc;

use pagewarden_kvcache::{KvPool, Owner, RequestId, TenantId};

use crate::llama::{Model, ModelError};
use crate::logprobs::TokenLogprobs;
use crate::sampling::Sampler;
use crate::token_output::TokenOutput;
use crate::FinishReason;
use crate::SamplingParams;

/// The result of one generation.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationOutput {
    /// The prompt's token ids.
    pub prompt_tokens: Vec<u32>,
    /// Generated token ids (an end token, see `EndTokens`, is not included).
    pub tokens: Vec<u32>,
    /// Per generated token, its logprobs when `SamplingParams::logprobs` asked for them.
    pub logprobs: Vec<TokenLogprobs>,
    /// Generated text, cut before any stop sequence.
    pub text: String,
    /// Why generation ended.
    pub finish_reason: FinishReason,
}

/// A model plus a KV pool: generates for one prompt at a time per call (calls may run
/// concurrently; each allocates its own pages and frees them when done).
#[derive(Clone)]
pub struct Engine {
    model: Arc<Model>,
    pool: KvPool,
    tenant: TenantId,
}

impl Engine {
    /// An engine over `model` drawing pages from `pool` (whose layout must be the model's).
    pub fn new(model: Arc<Model>, pool: KvPool) -> Engine {
        Engine {
            model,
            pool,
            tenant: TenantId::new("local"),
        }
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Generates a continuation of `prompt`.
    pub fn generate(
        &self,
        prompt: &[u32],
        params: &SamplingParams,
    ) -> Result<GenerationOutput, ModelError> {
        self.generate_streaming(prompt, params, |_| {})
    }

    /// [`Engine::generate`], calling `on_text` with each piece of text as it becomes final.
    pub fn generate_streaming(
        &self,
        prompt: &[u32],
        params: &SamplingParams,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerationOutput, ModelError> {
        let model = &*self.model;
        if prompt.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        // Refuse before allocating anything when the request cannot fit.
        let total = prompt.len() + params.max_tokens;
        if total > model.context_length() {
            return Err(ModelError::ContextExceeded {
                tokens: total,
                context: model.context_length(),
            });
        }
        let owner = Owner {
            request: RequestId::random(),
            tenant: self.tenant.clone(),
        };
        let mut seq = self.pool.allocate(owner, total)?;
        let mut logits = model.prefill(&mut seq, prompt)?;
        let tok = model.tokenizer();
        let mut sampler = Sampler::for_model(params, prompt, tok);
        let mut out = TokenOutput::new(tok, params);
        let mut tokens = Vec::new();
        let mut logprobs = Vec::new();
        let mut text = String::new();
        let finish_reason = loop {
            if params.max_tokens == 0 {
                break FinishReason::Length;
            }
            let sampled = sampler.next(&logits);
            let emitted = out.push(sampled.token);
            if !emitted.end_of_generation {
                tokens.push(sampled.token);
                logprobs.extend(sampled.logprobs);
            }
            if !emitted.text.is_empty() {
                on_text(&emitted.text);
                text.push_str(&emitted.text);
            }
            if let Some(finish) = emitted.finish {
                break finish;
            }
            logits = model
                .decode_step(&mut [(&mut seq, sampled.token)])
                .pop()
                .expect("one result per sequence")?;
        };
        Ok(GenerationOutput {
            prompt_tokens: prompt.to_vec(),
            tokens,
            logprobs,
            text,
            finish_reason,
        })
    }
}
