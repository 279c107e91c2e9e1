//! The model on a GPU (feature `cuda`): the one forward pass (`llama/forward.rs`) on the
//! device's backend, the weights and the KV pages' data in device memory, the pages owned by
//! the host pool.
//!
//! - `error.rs`: `GpuError`.
//! - `backend.rs`: `Gpu`, the CUDA implementation of `backend::Backend`; `DeviceWeights`.
//! - `kv_store.rs` + `kv_store.cu`: the generation-checked K/V write kernel and its PTX.
//! - `worker.rs`: `GpuWorker`, a device mirror of a host `KvPool` for the prefill and decode
//!   workers (generation sync, pinned staging, residency of committed pages).

mod backend;
mod error;
mod kv_store;
mod worker;

pub use error::GpuError;
pub use kv_store::{compile_kv_store, write_kv_store_ptx, MODEL_PTX_DIR_ENV, PTX_FILE};
pub use worker::{GpuWorker, GpuWorkerOptions, FLOAT_ACTS_ENV};
