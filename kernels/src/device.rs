//! Backend selection for `--device` flags and config: `cpu` or `cuda:N` (`cuda` means `cuda:0`).
//!
//! Always compiled (no `cuda` feature needed) so every binary can parse the flag and, when it was
//! built without CUDA, refuse `cuda:N` with a message that says how to get it.

use std::fmt;
use std::str::FromStr;

/// Where kernels run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CPU reference kernels (the default).
    #[default]
    Cpu,
    /// The CUDA kernels on the GPU with this ordinal.
    Cuda(usize),
}

impl Device {
    /// True when this build carries the CUDA backend (the `cuda` feature of
    /// `pagewarden-kernels`).
    pub const fn cuda_compiled() -> bool {
        cfg!(feature = "cuda")
    }

    /// Ok when this build can at least try the device (CPU always; CUDA only with the feature).
    pub fn check_compiled(self) -> Result<Device, ParseDeviceError> {
        match self {
            Device::Cpu => Ok(self),
            Device::Cuda(_) if Device::cuda_compiled() => Ok(self),
            Device::Cuda(_) => Err(ParseDeviceError::NotCompiled(self.to_string())),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Why a device string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseDeviceError {
    /// Neither `cpu` nor `cuda[:N]`.
    #[error(
        "unknown device {0:?}: expected `cpu`, `cuda` or `cuda:N` (N = GPU ordinal, e.g. cuda:0)"
    )]
    Unknown(String),
    /// `cuda:` followed by something that is not a GPU ordinal.
    #[error("bad GPU ordinal in {0:?}: expected `cuda:N` with N a non-negative integer")]
    BadOrdinal(String),
    /// A CUDA device was asked of a build without the `cuda` feature.
    #[error(
        "device {0} requested, but this binary was built without CUDA support; rebuild with \
         `--features pagewarden-kernels/cuda` or use `--device cpu`"
    )]
    NotCompiled(String),
}

impl FromStr for Device {
    type Err = ParseDeviceError;

    fn from_str(s: &str) -> Result<Device, ParseDeviceError> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => match t.strip_prefix("cuda:") {
                Some(n) => n
                    .parse::<usize>()
                    .map(Device::Cuda)
                    .map_err(|_| ParseDeviceError::BadOrdinal(s.to_string())),
                None => Err(ParseDeviceError::Unknown(s.to_string())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_cuda() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!(" CUDA ".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse::<Device>(), Ok(Device::Cuda(3)));
        assert_eq!(
            Device::Cuda(2).to_string().parse::<Device>(),
            Ok(Device::Cuda(2))
        );
    }

    #[test]
    fn refuses_garbage_with_a_clear_error() {
        let e = "tpu".parse::<Device>().unwrap_err();
        assert!(e.to_string().contains("expected `cpu`"), "{e}");
        let e = "cuda:x".parse::<Device>().unwrap_err();
        assert_eq!(e, ParseDeviceError::BadOrdinal("cuda:x".into()));
        assert!("cuda:-1".parse::<Device>().is_err());
    }

    #[test]
    fn cuda_needs_the_feature() {
        let r = Device::Cuda(0).check_compiled();
        assert_eq!(r.is_ok(), Device::cuda_compiled());
        assert_eq!(Device::Cpu.check_compiled(), Ok(Device::Cpu));
    }
}
