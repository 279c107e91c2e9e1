//! What can go wrong in the CUDA backend, classified where it happens.

use cudarc::driver::DriverError;

/// A CUDA backend failure. Every variant says what failed and, where the fix is known, how.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The NVIDIA driver library (libcuda.so.1) could not be loaded.
    #[error(
        "CUDA is not available: the NVIDIA driver library (libcuda.so / libcuda.so.1) was not \
         found; install the NVIDIA driver or run with --device cpu"
    )]
    NoDriver,
    /// The driver is present but reports no GPU with this ordinal.
    #[error("no CUDA device cuda:{ordinal} ({count} device(s) visible)")]
    NoSuchDevice {
        /// Requested ordinal.
        ordinal: usize,
        /// Devices the driver reports.
        count: usize,
    },
    /// NVRTC is needed (no precompiled PTX) but its library could not be loaded.
    #[error(
        "NVRTC (libnvrtc.so.12) could not be loaded, and no precompiled PTX was given: {detail}. \
         Install it with `python3 -m pip install nvidia-cuda-nvrtc-cu12==12.*` and put its lib \
         directory on LD_LIBRARY_PATH (or set PAGEWARDEN_NVRTC_LIB to the library file), or set \
         PAGEWARDEN_PTX_DIR to a directory of PTX files written by the cuda_ptx test"
    )]
    NoNvrtc {
        /// Where we looked.
        detail: String,
    },
    /// NVRTC rejected a kernel source.
    #[error("NVRTC failed to compile kernel module {module} for {arch}:\n{log}")]
    Compile {
        /// Module name (file stem under kernels/src/cuda).
        module: &'static str,
        /// Target architecture (e.g. compute_90).
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// A PTX file in PAGEWARDEN_PTX_DIR is missing, unreadable or built from other sources.
    #[error("precompiled PTX {path}: {why}")]
    Ptx {
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// The driver refused PTX that is newer than it, or that it could not parse after the ISA
    /// version was lowered to its own (see `jit.rs`).
    #[error(
        "the NVIDIA driver (CUDA {driver}) refused kernel PTX of ISA {isa}: {source}. The PTX \
         comes from a newer NVRTC than the driver; update the driver, or build the PTX with \
         an NVRTC no newer than the driver (python3 -m pip install \
         'nvidia-cuda-nvrtc-cu12=={driver}.*', then regenerate it)"
    )]
    PtxVersion {
        /// The PTX's `.version` as NVRTC wrote it.
        isa: String,
        /// The driver's CUDA version, e.g. `12.4`.
        driver: String,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A driver call failed (allocation, copy, launch, module load, ...).
    #[error("CUDA driver error during {what}: {source}")]
    Driver {
        /// The operation.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// Arguments of a launch wrapper do not fit together; nothing was launched.
    #[error("{op}: {why}")]
    Shape {
        /// The kernel wrapper.
        op: &'static str,
        /// What does not fit.
        why: String,
    },
}

/// Adds the operation name to a driver error.
pub(crate) trait DriverContext<T> {
    /// Maps `Err(DriverError)` to [`CudaError::Driver`] naming `what`.
    fn during(self, what: &'static str) -> Result<T, CudaError>;
}

impl<T> DriverContext<T> for Result<T, DriverError> {
    fn during(self, what: &'static str) -> Result<T, CudaError> {
        self.map_err(|source| CudaError::Driver { what, source })
    }
}

/// Shorthand for a [`CudaError::Shape`] check.
pub(crate) fn ensure(
    ok: bool,
    op: &'static str,
    why: impl FnOnce() -> String,
) -> Result<(), CudaError> {
    if ok {
        Ok(())
    } else {
        Err(CudaError::Shape { op, why: why() })
    }
}
