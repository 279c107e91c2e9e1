//! The Llama forward pass on a GPU (feature `cuda`): weights and the paged KV pool live in
//! device memory; prefill and batched decode return logits only.
//!
//! - `error.rs`: `GpuError`.
//! - `pages.rs`: `PageBook` (free list, per-page generations, pending device updates),
//!   `GpuSequence` (page table with the generations it holds).
//! - `kv_store.rs` + `kv_store.cu`: the generation-checked K/V write kernel and its PTX.
//! - `weights.rs`: the GGUF weights uploaded as they are (quantized).
//! - `model.rs`: `GpuModel` (load, sequences, prefill, decode_step, release, revoke_page).
//! - `forward.rs`: the batched forward pass.
//! - `worker.rs`: `GpuWorker`, a device mirror of a host `KvPool` for the prefill and decode
//!   workers (generation sync, pinned staging, residency of committed pages).

mod error;
mod forward;
mod kv_store;
mod model;
mod pages;
mod weights;
mod worker;

pub use error::GpuError;
pub use kv_store::{compile_kv_store, write_kv_store_ptx, MODEL_PTX_DIR_ENV, PTX_FILE};
pub use model::{GpuModel, GpuOptions, FLOAT_ACTS_ENV};
pub use pages::{DevicePageId, GpuSequence, PageBook, PageEntry, PageGeneration};
pub use worker::{GpuWorker, GpuWorkerOptions};
