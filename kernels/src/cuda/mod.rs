//! CUDA backend (feature `cuda`): the same kernels as the CPU reference, on an NVIDIA GPU.
//!
//! Kernel sources live in this directory, each `.cu` beside the Rust wrapper that launches it
//! (`prelude.cuh` beside `source.rs`, which prepends it), are embedded in the binary and
//! compiled with NVRTC on first use (or read as precompiled PTX from `PAGEWARDEN_PTX_DIR` on
//! machines with only the driver). cudarc loads libcuda and libnvrtc at run time, so a build
//! with this feature runs anywhere and reports a clear [`CudaError`] where there is no GPU.
//!
//! (The crate-level `device` module, `Device { Cpu, Cuda(n) }` parsed from `cpu|cuda:N`, is
//! compiled without the feature too.)
//!
//! - `error`: [`CudaError`].
//! - `loader`: finding libcuda / libnvrtc without panicking.
//! - `source`: the embedded `.cu` modules and their kernel names.
//! - `ptx`: NVRTC compilation and PTX files on disk.
//! - `jit`: loading PTX on a driver older than the NVRTC that wrote it.
//! - `context`: [`CudaBackend`], one GPU with lazily loaded kernels and buffer helpers.
//! - `matmul`: quantized / dense matrix products and embedding rows.
//! - `elementwise`: RMSNorm, softmax, RoPE, SwiGLU, residual add.
//! - `pool`: the device KV page pool ([`DeviceKvPool`], [`PageShape`]).
//! - `attention`: paged attention with the on-GPU generation check.
//! - `pages`: page checksums, zeroing, guard words.
//! - `checksum`: PWSUM64, the page checksum, on the CPU.

mod attention;
mod checksum;
mod context;
mod elementwise;
mod error;
mod jit;
mod loader;
mod matmul;
mod pages;
mod pool;
mod ptx;
mod source;

pub use attention::{AttentionBatch, PageFault};
pub use checksum::{fmix64, pwsum64};
pub use context::{device_count, CudaBackend, PtxSource};
pub use error::CudaError;
pub use jit::{driver_version, load_ptx, lower_ptx_isa, max_ptx_isa, ptx_isa, PtxIsa};
pub use loader::{driver_present, ensure_nvrtc, nvrtc_present};
pub use matmul::{DeviceMatrix, DeviceQ8Acts};
pub use pool::{DeviceKvPool, PageShape};
pub use ptx::{compile, ptx_path, read_ptx, write_ptx, DEFAULT_PTX_ARCH, PTX_DIR_ENV};
pub use source::Module;

/// The cudarc version this backend is built on (for buffer types such as `CudaSlice`).
pub use cudarc;
