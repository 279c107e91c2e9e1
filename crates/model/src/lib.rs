//! GGUF, tokenizer, chat template, Llama forward over paged KV, and sampling.
//!
//! Module map (one line per file):
//! - `gguf/mod.rs`: GGUF module root and re-exports
//! - `gguf/error.rs`: `GgufError`, one variant per malformed-input case
//! - `gguf/types.rs`: `GgmlType` ids, block sizes, block byte sizes
//! - `gguf/value.rs`: `MetaValue`, `MetaArray`, `Metadata` with typed getters
//! - `gguf/cursor.rs`: bounds-checked little-endian reads
//! - `gguf/reader.rs`: header parser and tensor bounds/alignment checks
//! - `gguf/file.rs`: `GgufFile` (memory-mapped), `TensorInfo`, `TensorView`
//! - `gguf/writer.rs`: `GgufWriter` for tests
//! - `gguf/quant.rs`: ggml reference quantizers/dequantizers (Q4_0, Q4_1, Q8_0, F16, F32)
//! - `gguf/tiny.rs`: `tiny_llama_gguf`, the seeded tiny random Llama for model-free tests
//! - `tokenizer_bytes.rs`: GPT-2 byte ↔ unicode stand-in table

pub mod gguf;
#[allow(dead_code)] // used by the tokenizer, which lands next
mod tokenizer_bytes;

pub use gguf::{
    tiny_llama_gguf, GgmlType, GgufError, GgufFile, GgufWriter, TensorInfo, TensorView,
};
