//! The CPU kernels, the reference implementation. The crate root re-exports each public module
//! under its own name (`pagewarden_kernels::matmul`, `pagewarden_kernels::attention`, ...), so
//! this module is a place in the source tree, not a step in any path a caller writes.

pub mod act;
pub mod act_k;
pub mod activation;
pub mod attention;
pub(crate) mod attention_decode;
pub mod attention_flash;
pub(crate) mod attention_sums;
#[cfg(target_arch = "x86_64")]
pub(crate) mod attention_tiled;
pub mod expf;
pub mod isa;
pub mod matmul;
pub mod norm;
pub mod parallel;
pub mod quant;
pub mod quant_k;
pub mod rope;
pub(crate) mod scratch;
pub mod vec;
