//! What the prefill and decode workers share: who they are, which devices they accept, how they
//! load the model and size the KV pool, how they start up and serve gRPC, and the request parts
//! both parse the same way.
//!
//! - `role.rs`: `Role`, a worker's name, binary and whether it was built with CUDA.
//! - `device.rs`: `check_device` (no `cuda:N` in a build without CUDA) and `open_device`.
//! - `compute.rs`: `Compute`, the engine both workers run passes on (CPU or GPU), and
//!   `ComputeError`.
//! - `gpu.rs` (feature `cuda`): `open_gpu`, the model on a GPU over the host pool.
//! - `startup.rs`: `load`: the model, the preflight (I7) and the preflighted KV pool.
//! - `boot.rs`: `start_up` (a failure is reported to the auditor) and `auditor_client`.
//! - `serve.rs`: the gRPC and metrics listeners, pool gauges, and serving until shutdown.
//! - `transfer_security.rs`: the KV transfer connection's TLS, role check and refusal reports.
//! - `wire.rs`: the write grant, the commit manifest and logprobs at the gRPC boundary.
//! - `worker_error.rs`: `WorkerError`, why a worker refused or ended a request, and its one
//!   mapping to a gRPC status; `QueueRefusal`.
//! - `fair_queue.rs`: `FairQueue`, both workers' waiting line (FIFO per tenant, tenants in turn).
//! - `prefix_log.rs`: `PrefixCacheLog`, what both say of their prefix cache (metrics, and hits,
//!   misses and evictions to the auditor).
#![warn(missing_docs)]

// The defense switches are for the system tests' debug build only, never a release build.
#[cfg(all(feature = "unsafe-test-switches", not(debug_assertions)))]
compile_error!(
    "the `unsafe-test-switches` feature turns defenses off: debug test builds only, never a \
     release build"
);

mod boot;
mod compute;
mod device;
mod fair_queue;
#[cfg(feature = "cuda")]
mod gpu;
mod prefix_log;
mod role;
mod serve;
mod startup;
mod transfer_security;
pub mod wire;
mod worker_error;

pub use boot::{auditor_client, start_up, AUDITOR_BUFFER};
pub use compute::{Compute, ComputeError};
pub use device::{check_device, open_device, DeviceError, Gpu, GpuOptions, OpenError, Opened};
pub use fair_queue::FairQueue;
#[cfg(feature = "cuda")]
pub use gpu::GpuOpenError;
pub use prefix_log::PrefixCacheLog;
pub use role::Role;
pub use serve::{pool_gauges, serve, BindError, Listeners, MetricsEndpoint};
pub use startup::{load, Loaded, PoolOptions, StartupError};
pub use transfer_security::{receiver_options, sender_tls, TransferSecurityError};
pub use worker_error::{QueueRefusal, WorkerError};
