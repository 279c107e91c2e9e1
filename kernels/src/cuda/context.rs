//! One GPU: driver context, stream, and kernels loaded lazily (candle's `get_or_load_func`).
//!
//! A module is compiled (NVRTC, for this GPU's architecture) or read from `PAGEWARDEN_PTX_DIR`
//! the first time one of its kernels is launched, and cached for the life of the backend.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits,
};

use super::error::{CudaError, DriverContext};
use super::jit::load_ptx;
use super::loader::driver_present;
use super::ptx::{compile, read_ptx, PTX_DIR_ENV};
use super::source::Module;

/// Where kernel PTX comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PtxSource {
    /// Compile with NVRTC at first use, for the GPU's own architecture.
    Nvrtc,
    /// Read precompiled `<module>.ptx` files from this directory (no NVRTC needed).
    Dir(PathBuf),
}

impl PtxSource {
    /// `Dir($PAGEWARDEN_PTX_DIR)` when that variable is set, else `Nvrtc`.
    pub fn from_env() -> PtxSource {
        match std::env::var_os(PTX_DIR_ENV) {
            Some(d) if !d.is_empty() => PtxSource::Dir(PathBuf::from(d)),
            _ => PtxSource::Nvrtc,
        }
    }
}

/// `90` for `compute_90` (0 when unparsable, so an unknown header never blocks loading).
fn arch_number(arch: &str) -> u32 {
    arch.trim_start_matches(|c: char| !c.is_ascii_digit())
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .unwrap_or(0)
}

/// The CUDA backend for one GPU. Cheap to share behind an `Arc`; kernel launches go to one stream.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    ptx: PtxSource,
    modules: Mutex<HashMap<Module, Arc<CudaModule>>>,
    funcs: Mutex<HashMap<&'static str, CudaFunction>>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.ctx.ordinal())
            .field("arch", &self.arch)
            .field("ptx", &self.ptx)
            .finish()
    }
}

/// Number of GPUs the driver sees; a clear error (never a panic) without a driver.
pub fn device_count() -> Result<usize, CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    let n = CudaContext::device_count().during("cuInit / cuDeviceGetCount")?;
    Ok(n.max(0) as usize)
}

impl CudaBackend {
    /// True when a driver is installed and sees at least one GPU.
    pub fn is_available() -> bool {
        matches!(device_count(), Ok(n) if n > 0)
    }

    /// Opens GPU `ordinal`, taking PTX as [`PtxSource::from_env`] says.
    pub fn new(ordinal: usize) -> Result<CudaBackend, CudaError> {
        CudaBackend::with_ptx_source(ordinal, PtxSource::from_env())
    }

    /// Opens GPU `ordinal` with an explicit PTX source.
    pub fn with_ptx_source(ordinal: usize, ptx: PtxSource) -> Result<CudaBackend, CudaError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).during("creating the context")?;
        let (major, minor) = ctx
            .compute_capability()
            .during("reading the compute capability")?;
        let stream = ctx.default_stream();
        Ok(CudaBackend {
            ctx,
            stream,
            arch: format!("compute_{major}{minor}"),
            ptx,
            modules: Mutex::new(HashMap::new()),
            funcs: Mutex::new(HashMap::new()),
        })
    }

    /// The driver context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The GPU's virtual architecture, e.g. `compute_90`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Where PTX comes from.
    pub fn ptx_source(&self) -> &PtxSource {
        &self.ptx
    }

    /// The GPU's name as the driver reports it.
    pub fn name(&self) -> Result<String, CudaError> {
        self.ctx.name().during("reading the device name")
    }

    /// Loads (compiling or reading PTX on first use) and caches `module`.
    pub fn module(&self, module: Module) -> Result<Arc<CudaModule>, CudaError> {
        let mut cache = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = cache.get(&module) {
            return Ok(m.clone());
        }
        let text = match &self.ptx {
            PtxSource::Nvrtc => compile(module, &self.arch)?,
            PtxSource::Dir(dir) => {
                let (arch, text) = read_ptx(dir, module)?;
                // PTX for a newer architecture than this GPU's cannot be JIT-compiled for it.
                if arch_number(&arch) > arch_number(&self.arch) {
                    return Err(CudaError::Ptx {
                        path: super::ptx::ptx_path(dir, module).display().to_string(),
                        why: format!(
                            "built for {arch}, this GPU is {}; regenerate it for {} or unset {PTX_DIR_ENV}",
                            self.arch, self.arch
                        ),
                    });
                }
                text
            }
        };
        let loaded = load_ptx(&self.ctx, text)?;
        cache.insert(module, loaded.clone());
        Ok(loaded)
    }

    /// Loads every module now (start-up check; later launches then never compile).
    pub fn load_all(&self) -> Result<(), CudaError> {
        for m in Module::ALL {
            for f in m.functions() {
                self.func(m, f)?;
            }
        }
        Ok(())
    }

    /// Kernel `name` of `module`, loading the module on first use.
    pub fn func(&self, module: Module, name: &'static str) -> Result<CudaFunction, CudaError> {
        if let Some(f) = self
            .funcs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Ok(f.clone());
        }
        let f = self
            .module(module)?
            .load_function(name)
            .during("looking up a kernel")?;
        self.funcs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, f.clone());
        Ok(f)
    }

    /// Copies `data` to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, CudaError> {
        self.stream.clone_htod(data).during("copying to the device")
    }

    /// A new zeroed device buffer of `len` elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        self.stream
            .alloc_zeros(len)
            .during("allocating device memory")
    }

    /// Copies a device buffer back (waits for the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        buf: &CudaSlice<T>,
    ) -> Result<Vec<T>, CudaError> {
        self.stream.clone_dtoh(buf).during("copying to the host")
    }

    /// Overwrites a device buffer with `data` (same length).
    pub fn write<T: DeviceRepr>(
        &self,
        buf: &mut CudaSlice<T>,
        data: &[T],
    ) -> Result<(), CudaError> {
        super::error::ensure(buf.len() == data.len(), "write", || {
            format!(
                "buffer holds {} elements, data has {}",
                buf.len(),
                data.len()
            )
        })?;
        self.stream
            .memcpy_htod(data, buf)
            .during("copying to the device")
    }

    /// Waits for every launch so far.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize().during("synchronizing the stream")
    }
}

#[cfg(test)]
mod tests {
    use super::arch_number;

    #[test]
    fn architectures_compare_by_number() {
        assert_eq!(arch_number("compute_90"), 90);
        assert_eq!(arch_number("compute_90a"), 90);
        assert!(arch_number("compute_100") > arch_number("compute_90"));
        assert_eq!(arch_number("unknown"), 0);
    }
}
