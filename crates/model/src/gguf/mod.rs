//! GGUF (v2/v3) files: a memory-mapped reader that rejects malformed input with typed errors,
//! a writer for tests, ggml quantizers, the tiny random Llama used by model-free tests, and
//! tiny random models of every architecture for the llama.cpp parity test, and random weights
//! in another file's layout or a published model's (a real model's shapes without its weights).

mod cursor;
mod error;
mod file;
mod quant;
mod random_like;
mod reader;
mod shapes;
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
pub use random_like::{write_random, write_random_like};
pub use reader::{DEFAULT_ALIGNMENT, MAX_DIMS};
pub use shapes::{llama_3_2_1b_q4_k_m, TensorEntry};
pub use tiny::{tiny_llama_gguf, tiny_llama_gguf_with, TinyLlamaSpec};
pub use tiny_arch::{tiny_arch_gguf, tiny_arch_writer, ArchSpec, TinyArch};
pub use types::GgmlType;
pub use value::{MetaArray, MetaValue, Metadata};
pub use writer::GgufWriter;
