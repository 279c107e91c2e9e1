//! `--device`: a build without CUDA refuses `cuda:N` before anything is loaded, with a message
//! that says how to get a build that has it.

use pagewarden_kernels::Device;

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
