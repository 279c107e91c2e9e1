//! `--device`: a build without CUDA refuses `cuda:N` before anything is loaded, with a message
//! that says how to get a build that has it; `open_device` then opens the CPU or the GPU.

use pagewarden_kernels::Device;
use pagewarden_kvcache::KvPool;
use std::sync::Arc;

use pagewarden_model::Model;

use crate::Role;

/// A device this binary cannot use.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// `cuda:N` asked of a binary built without its `cuda` feature.
    #[error(
        "--device {device}: this {binary} was built without CUDA support; \
         rebuild with `--features {binary}/cuda` or use --device cpu"
    )]
    NotBuilt {
        /// The device asked for.
        device: Device,
        /// The binary that was asked.
        binary: &'static str,
    },
}

/// Refuses `cuda:N` when `role`'s binary was built without CUDA, before anything is loaded.
pub fn check_device(device: Device, role: &Role) -> Result<(), DeviceError> {
    match device {
        Device::Cuda(_) if !role.cuda_built => Err(DeviceError::NotBuilt {
            device,
            binary: role.binary,
        }),
        Device::Cpu | Device::Cuda(_) => Ok(()),
    }
}

/// What a worker asks of its GPU, when it runs on one.
#[derive(Clone, Copy, Debug)]
pub struct GpuOptions {
    /// Pages per pinned staging round between host and device.
    pub staging_pages: usize,
    /// Whether device pages are zeroed when they are taken for a new sequence.
    pub zero_new_pages: bool,
}

/// The GPU engine of this build: `pagewarden-model`'s `GpuWorker` with the `cuda` feature.
#[cfg(feature = "cuda")]
pub type Gpu = pagewarden_model::cuda::GpuWorker;

/// The GPU engine of this build: none without the `cuda` feature (no value exists).
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub enum Gpu {}

/// The device, opened.
// Made once at start-up and moved straight into the worker's engine: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Opened {
    /// The CPU reference kernels over the host pool's pages.
    Cpu,
    /// A GPU mirroring the host pool's pages in device memory.
    Gpu(Gpu),
}

/// Why the device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// `cuda:N` asked of a binary built without CUDA.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The GPU could not take the model.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Gpu(#[from] crate::GpuOpenError),
    /// `cuda:N` in a build whose `pagewarden-worker` lacks the `cuda` feature.
    #[error("cuda:{0} is unavailable in this build")]
    Unavailable(usize),
}

/// Opens `device` for `role` over `pool`, after [`check_device`]. A CUDA build without a
/// driver or GPU fails here with the driver's reason.
pub fn open_device(
    device: Device,
    role: &Role,
    model: &Arc<Model>,
    pool: &KvPool,
    gpu: &GpuOptions,
) -> Result<Opened, OpenError> {
    check_device(device, role)?;
    match device {
        Device::Cpu => Ok(Opened::Cpu),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => Ok(Opened::Gpu(crate::gpu::open_gpu(model, pool, n, gpu)?)),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(n) => {
            let _ = (model, pool, gpu);
            Err(OpenError::Unavailable(n))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUILT: Role = Role {
        name: "prefill",
        binary: "pagewarden-prefill",
        cuda_built: true,
    };
    const NOT_BUILT: Role = Role {
        cuda_built: false,
        ..BUILT
    };

    #[test]
    fn cuda_is_refused_only_without_cuda_support() {
        assert!(check_device(Device::Cpu, &NOT_BUILT).is_ok());
        assert!(check_device(Device::Cuda(0), &BUILT).is_ok());
        let e = check_device(Device::Cuda(1), &NOT_BUILT).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--device cuda:1: this pagewarden-prefill was built without CUDA support; \
             rebuild with `--features pagewarden-prefill/cuda` or use --device cpu"
        );
    }
}
