//! GGUF, tokenizer, chat template, Llama-family forward over paged KV, and sampling.
//!
//! Feature `engine` (default) is the forward pass over paged KV (`arch`, `config`,
//! `rope_scaling`, `weights`, `llama`, `engine`), which links the kernels and the KV pool; the
//! router, which only reads the GGUF's tokenizer and template, builds without it.
//!
//! Module map (one line per file):
//! - `arch/mod.rs`: `Arch` (from `general.architecture`), `Recipe` (what the shared block does per architecture), per-layer extras
//! - `arch/llama.rs`: the Llama-style block (llama, Mistral, qwen2, qwen3, phi3), Llama's recipe
//! - `arch/qwen2.rs`: Qwen2's recipe (Q/K/V biases, NeoX RoPE)
//! - `arch/qwen3.rs`: Qwen3's recipe (per-head Q/K RMSNorm, NeoX RoPE)
//! - `arch/phi3.rs`: Phi-3's recipe (fused QKV and gate-up, NeoX RoPE, pre-scaled Q; no sliding window, as llama.cpp)
//! - `arch/gemma3.rs`: Gemma 3's parameters, extra norms and block
//! - `gguf/mod.rs`: GGUF module root and re-exports
//! - `gguf/error.rs`: `GgufError`, one variant per malformed-input case
//! - `gguf/types.rs`: `GgmlType` ids, block sizes, block byte sizes
//! - `gguf/value.rs`: `MetaValue`, `MetaArray`, `Metadata` with typed getters
//! - `gguf/cursor.rs`: bounds-checked little-endian reads
//! - `gguf/reader.rs`: header parser and tensor bounds/alignment checks
//! - `gguf/file.rs`: `GgufFile` (memory-mapped), `TensorInfo`, `TensorView`
//! - `gguf/writer.rs`: `GgufWriter` for tests
//! - `gguf/quant.rs`: ggml reference quantizers/dequantizers (Q4_0, Q4_1, Q8_0, F16, F32; Q5_0 and K-quants via the kernels)
//! - `gguf/tiny.rs`: `tiny_llama_gguf`, the seeded tiny random Llama for model-free tests
//! - `config.rs`: `LlamaConfig` from GGUF `<arch>.*` metadata
//! - `rope_scaling.rs`: `RopeScaling` (linear factor, Llama 3's `rope_freqs`; other kinds refused)
//! - `backend/mod.rs`: `Backend`, the ops of the one forward pass, which each device implements
//! - `backend/cpu.rs`: `Cpu`, the CPU's backend (the reference): the kernels of `pagewarden_kernels`, K/V in the host pool's pages
//! - `engine.rs`: `Engine::generate`, single-process generation over a local `KvPool`
//! - `weights.rs`: weights as zero-copy views into the GGUF mapping, per-layer attention
//! - `cuda/`: `GpuWorker`, the one forward pass on a GPU over a device mirror of the host pool's pages (feature `cuda`)
//! - `llama/`: `Model` (load, prefill, batched decode over paged KV), `ModelError`
//! - `chat.rs`: `ChatTemplate` (minijinja, HF-compatible), `ChatMessage`
//! - `chat_guard.rs`: message content is text: control-token texts in content are guarded through rendering
//! - `sampling.rs`: `Sampler` (penalties, min_tokens, greedy, temperature, min-p, top-k, top-p, seeded), `EndTokens`; the parameters, `Grammar` and their limits are `pagewarden_types::sampling`'s, re-exported here
//! - `penalties.rs`: `Penalties`, repetition (vLLM/HF) and presence/frequency (OpenAI) over a sequence's history
//! - `logprobs.rs`: `TokenLogprobs`, the log-softmax of raw logits at the chosen and top tokens
//! - `stop.rs`: `StopMatcher`, stop sequences across streamed text
//! - `tokenizer.rs`: `Tokenizer` (byte-level BPE or SentencePiece from GGUF metadata, llama.cpp-exact ids)
//! - `tokenizer_bytes.rs`: GPT-2 byte ↔ unicode stand-in table
//! - `tokenizer_pretok.rs`: `PreTokenizer`, llama.cpp's word splitting per `tokenizer.ggml.pre`
//! - `tokenizer_bpe.rs`: ranked BPE merging of one word
//! - `tokenizer_spm.rs`: SentencePiece scored merges with byte fallback (`tokenizer.ggml.model = llama`)
//! - `tokenizer_stream.rs`: `StreamDecoder`, UTF-8-safe incremental detokenizing
//! - `tool_calls.rs`: `ToolCallFormat` (how a template's model calls tools), parsing a reply into calls, `ToolCallStream`
//! - `token_output.rs`: `TokenOutput`, sampled tokens to a completion's text and end (end tokens, stop strings, `max_tokens`), for the engine and decode
#![warn(missing_docs)]

#[cfg(feature = "engine")]
pub mod arch;
#[cfg(feature = "engine")]
mod backend;
pub mod chat;
mod chat_guard;
#[cfg(feature = "engine")]
pub mod config;
pub mod constraint;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "engine")]
pub mod engine;
pub mod gguf;
#[cfg(feature = "engine")]
pub mod llama;
pub mod logprobs;
pub mod penalties;
#[cfg(feature = "engine")]
pub mod rope_scaling;
pub mod sampling;
pub mod stop;
pub mod token_output;
pub mod tokenizer;
mod tokenizer_bpe;
mod tokenizer_bytes;
pub mod tokenizer_pretok;
mod tokenizer_spm;
mod tokenizer_stream;
pub mod tool_calls;
#[cfg(feature = "engine")]
pub mod weights;

#[cfg(feature = "engine")]
pub use arch::Arch;
pub use chat::{ChatError, ChatMessage, ChatTemplate};
#[cfg(feature = "engine")]
pub use config::LlamaConfig;
pub use constraint::{Constraint, ConstraintError, Grammars};
#[cfg(feature = "engine")]
pub use engine::{Engine, GenerationOutput};
pub use gguf::{
    tiny_llama_gguf, GgmlType, GgufError, GgufFile, GgufWriter, TensorInfo, TensorView,
};
#[cfg(feature = "engine")]
pub use llama::{LoadOptions, Model, ModelError};
pub use logprobs::{Logprob, TokenLogprobs, LOGPROB_FLOOR};
#[cfg(feature = "engine")]
pub use pagewarden_kernels::Packing;
pub use pagewarden_types::sampling::{
    Grammar, SamplingError, SamplingParams, GREEDY_BELOW, LOGIT_BIAS_RANGE, MAX_LOGIT_BIAS,
    MAX_STOP, MAX_STOP_BYTES, MAX_STOP_TOKEN_IDS, MAX_TOP_LOGPROBS,
};
pub use pagewarden_types::FinishReason;
pub use sampling::{argmax, EndTokens, Sampled, Sampler};
pub use stop::{StopMatcher, StopOutcome};
pub use token_output::{Emitted, TokenOutput};
pub use tokenizer::{TokenKind, Tokenizer, TokenizerError};
pub use tokenizer_stream::StreamDecoder;
pub use tool_calls::{ParsedReply, ToolCall, ToolCallFormat, ToolCallStream};
