//! GGUF (v2/v3) files: a memory-mapped reader that rejects malformed input with typed errors,
//! a writer for tests, ggml quantizers, the tiny random Llama used by model-free tests, and
//! tiny random models of every architecture for the llama.cpp parity test, and random weights
//! in another file's layout (a real model's shapes without its weights).

mod cursor;
mod error;
mod file;
mod quant;
mod random_like;
mod reader;
mod tiny;
mod tiny_arch;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use file::{Contents, GgufFile, TensorInfo, TensorView};
pub use quant::{
    dequantize, f16_bytes, f32_bytes, quantize, quantize_q4_0, quantize_q4_1, quantize_q8_0,
};
pub use random_like::write_random_like;
pub use reader::{DEFAULT_ALIGNMENT, MAX_DIMS};
pub use tiny::{tiny_llama_gguf, tiny_llama_gguf_with, TinyLlamaSpec};
pub use tiny_arch::{tiny_arch_gguf, tiny_arch_writer, ArchSpec, TinyArch};
pub use types::GgmlType;
pub use value::{MetaArray, MetaValue, Metadata};
pub use writer::GgufWriter;
