//! Compute kernels for Pagewarden. The CPU functions here are the reference implementation;
//! SIMD paths are selected at run time and tested against the portable code.
//!
//! The CPU kernels live in `cpu/`, the CUDA backend in `cuda/` (each `.cu` beside the Rust
//! wrapper that launches it); the crate root re-exports the CPU modules under their own names.
//!
//! - `isa`: run-time detection of the instruction set used by the fast paths.
//! - `parallel`: a configurable thread pool that splits work over output rows.
//! - `quant`: ggml block layouts (Q4_0, Q4_1, Q5_0, Q8_0, F16, BF16, F32), weight quantize/dequantize.
//! - `quant_k`: ggml K-quant super-blocks (Q4_K, Q5_K, Q6_K): unpacking and dequantization.
//! - `act`: per-32-block Q8 quantization of activations (Q8_0 / Q8_1 style), the input of the
//!   quantized products.
//! - `act_k`: per-256-block Q8_K quantization of activations, with 16-element sums, the input
//!   of the K-quant products.
//! - `matmul`: quantized matrix x vector / matrix x matrix products (`matmul/portable.rs`
//!   and `matmul/kquant_portable.rs` are the reference, `matmul/avx2.rs` and
//!   `matmul/kquant_avx2.rs` the x86 fast paths; `matmul/q4k_repacked.rs` is llama.cpp's
//!   order for Q4_K matrices it repacks, whole blocks of 8 rows; `matmul/packed.rs` and
//!   `matmul/packed_k.rs` interleave rows sixteen at a time at load for `matmul/avx512.rs`
//!   and `matmul/kquant_avx512.rs`; `matmul/bf16.rs` BF16 weights, llama.cpp's bf16-rounded
//!   activations, the same bits on every ISA).
//! - `vec`: f32 dot product with SIMD dispatch.
//! - `norm`: RMSNorm.
//! - `rope`: rotary position embedding, llama "normal" (adjacent pairs) style.
//! - `expf`: ggml's vectorized `exp` and 16-lane horizontal sum, bit-identical to llama.cpp.
//! - `activation`: the activation functions SiLU, SwiGLU, GeGLU and softmax (ggml's rounding).
//! - `attention`: causal grouped-query attention over paged f16 K/V blocks.
//! - `attention_flash`: attention with llama.cpp's flash-attention arithmetic (f16 accumulation).
//! - `attention_decode`: decode (one query token) attention split over keys, then columns.
//! - `attention_sums`: attention's dot products and weighted sums in ggml's order.
//! - `attention_tiled`: prefill attention on x86, tiled over query rows and keys.
//! - `device`: backend selection, `Device { Cpu, Cuda(n) }` from `cpu|cuda:N` (always compiled).
//! - `cuda` (feature `cuda`): the CUDA backend, the same kernels on the GPU (`cuda/mod.rs`).
#![warn(missing_docs)]

mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;

pub use cpu::{
    act, act_k, activation, attention, attention_flash, expf, isa, matmul, norm, parallel, quant,
    quant_k, rope, vec,
};
// The private CPU modules keep their crate-root paths too (`crate::attention_sums`, ...).
#[cfg(target_arch = "x86_64")]
use cpu::attention_tiled;
use cpu::{attention_decode, attention_sums, scratch};

pub use attention::{paged_attention, paged_attention_decode_many, AttnGeometry, KvBlock};
pub use attention_decode::DecodeQuery;
pub use device::{Device, ParseDeviceError};
pub use isa::Isa;
pub use matmul::packed::{PackedRows, Packing};
pub use matmul::{matmul, matmul_many, matmul_many_with, matmul_with, QMatrix};
pub use parallel::Parallel;
pub use quant::WeightType;
