//! Kernel source -> PTX with NVRTC, and PTX files on disk.
//!
//! A machine with only the NVIDIA driver (no CUDA toolkit, no NVRTC) runs the kernels from PTX
//! files written elsewhere: the `cuda_ptx` test writes one `<module>.ptx` per module into
//! `PAGEWARDEN_PTX_DIR`, and [`super::CudaBackend`] loads them from there when that variable is
//! set (the driver JIT-compiles PTX for the GPU it runs on). Each file starts with a header line
//! naming the module, the target and a hash of the source it came from; a file built from other
//! sources is refused, so stale PTX never runs.

use std::path::{Path, PathBuf};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use super::error::CudaError;
use super::loader::ensure_nvrtc;
use super::source::Module;

/// Target of the precompiled PTX the tests write (Hopper, H100/H200).
pub const DEFAULT_PTX_ARCH: &str = "compute_90";

/// Environment variable naming the directory of precompiled PTX files.
pub const PTX_DIR_ENV: &str = "PAGEWARDEN_PTX_DIR";

/// Compiles `module` for `arch` (e.g. `compute_90`) with NVRTC, returning the PTX text.
pub fn compile(module: Module, arch: &str) -> Result<String, CudaError> {
    ensure_nvrtc()?;
    let opts = CompileOptions {
        name: Some(format!("{}.cu", module.name())),
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        ..Default::default()
    };
    match compile_ptx_with_opts(module.source(), opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(CompileError::CompileError { nvrtc, log, .. }) => Err(CudaError::Compile {
            module: module.name(),
            arch: arch.to_string(),
            log: format!("{nvrtc:?}\n{}", log.to_string_lossy()),
        }),
        Err(other) => Err(CudaError::Compile {
            module: module.name(),
            arch: arch.to_string(),
            log: format!("{other:?}"),
        }),
    }
}

/// The path of `module`'s PTX file in `dir`.
pub fn ptx_path(dir: &Path, module: Module) -> PathBuf {
    dir.join(format!("{}.ptx", module.name()))
}

fn header(module: Module, arch: &str) -> String {
    format!(
        "// pagewarden-ptx module={} arch={arch} source={:016x}\n",
        module.name(),
        module.source_hash()
    )
}

/// Writes `ptx` (compiled from `module` for `arch`) to `dir` with its header line.
pub fn write_ptx(dir: &Path, module: Module, arch: &str, ptx: &str) -> Result<PathBuf, CudaError> {
    let path = ptx_path(dir, module);
    let io = |e: std::io::Error| CudaError::Ptx {
        path: path.display().to_string(),
        why: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(&path, format!("{}{ptx}", header(module, arch))).map_err(io)?;
    Ok(path)
}

/// Reads `module`'s PTX from `dir`, refusing a file made from other sources.
/// Returns the target architecture named in the header and the PTX.
pub fn read_ptx(dir: &Path, module: Module) -> Result<(String, String), CudaError> {
    let path = ptx_path(dir, module);
    let err = |why: String| CudaError::Ptx {
        path: path.display().to_string(),
        why,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
    let (first, _) = text
        .split_once('\n')
        .ok_or_else(|| err("empty file".into()))?;
    let want = format!("source={:016x}", module.source_hash());
    if !first.starts_with("// pagewarden-ptx ") || !first.contains(&want) {
        return Err(err(format!(
            "built from other kernel sources (header {first:?}, expected {want}); regenerate it \
             with the cuda_ptx test"
        )));
    }
    let arch = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("arch="))
        .unwrap_or("unknown")
        .to_string();
    Ok((arch, text))
}
