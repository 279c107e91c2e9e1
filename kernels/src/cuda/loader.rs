//! Finding the CUDA libraries at run time, without panicking.
//!
//! cudarc's dynamic loading panics when a library is missing, so every entry point asks here
//! first. The driver (libcuda.so.1) comes with the NVIDIA driver and is found by the system
//! loader or not at all. NVRTC (libnvrtc.so.12) often lives outside the loader's path (the
//! `nvidia-cuda-nvrtc-cu12` wheel puts it in site-packages), so when cudarc's own search fails we
//! try, in order: `PAGEWARDEN_NVRTC_LIB` (the library file or its directory), the wheel's lib
//! directory as reported by `python3`, and `/usr/local/cuda/lib64`. A hit is `dlopen`ed by full
//! path with `RTLD_GLOBAL` and kept for the life of the process; cudarc's later
//! `dlopen("libnvrtc.so.12")` then resolves to it, because glibc matches an already loaded
//! object by its SONAME.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::error::CudaError;

/// The SONAME cudarc (built for CUDA 12) looks for.
const NVRTC_SONAME: &str = "libnvrtc.so.12";

/// True when the NVIDIA driver library can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by name and drops it again.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// True when NVRTC can be loaded (after trying the fallbacks described in the module doc).
pub fn nvrtc_present() -> bool {
    ensure_nvrtc().is_ok()
}

/// Makes NVRTC loadable for cudarc, or says where it looked.
pub fn ensure_nvrtc() -> Result<(), CudaError> {
    static FOUND: OnceLock<Result<(), String>> = OnceLock::new();
    FOUND
        .get_or_init(find_nvrtc)
        .clone()
        .map_err(|detail| CudaError::NoNvrtc { detail })
}

fn cudarc_finds_nvrtc() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names and drops it again.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn find_nvrtc() -> Result<(), String> {
    if cudarc_finds_nvrtc() {
        return Ok(());
    }
    let mut tried = vec!["the system loader's path (LD_LIBRARY_PATH, ldconfig)".to_string()];
    for cand in candidates() {
        let shown = cand.display().to_string();
        if !cand.is_file() {
            tried.push(format!("{shown} (absent)"));
            continue;
        }
        match preload(&cand) {
            Ok(()) if cudarc_finds_nvrtc() => return Ok(()),
            Ok(()) => tried.push(format!(
                "{shown} (loaded, but not under the name {NVRTC_SONAME})"
            )),
            Err(e) => tried.push(format!("{shown} ({e})")),
        }
    }
    Err(format!("looked in {}", tried.join(", ")))
}

/// Library files to try, most explicit first.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("PAGEWARDEN_NVRTC_LIB") {
        let p = PathBuf::from(p);
        out.push(if p.is_dir() { p.join(NVRTC_SONAME) } else { p });
    }
    if let Some(dir) = wheel_lib_dir() {
        out.push(dir.join(NVRTC_SONAME));
    }
    out.push(PathBuf::from("/usr/local/cuda/lib64").join(NVRTC_SONAME));
    out
}

/// The lib directory of the `nvidia-cuda-nvrtc-cu12` wheel, if python3 has it installed.
fn wheel_lib_dir() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_nvrtc, os; \
             print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], 'lib'))",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8(out.stdout).ok()?;
    Some(PathBuf::from(dir.trim()))
}

#[cfg(unix)]
fn preload(path: &Path) -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading NVRTC runs only its (side-effect free) initialisers.
    let lib =
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| e.to_string())?;
    // Keep it mapped for the whole process: cudarc's handle will point at this same object.
    std::mem::forget(lib);
    Ok(())
}

#[cfg(not(unix))]
fn preload(_path: &Path) -> Result<(), String> {
    Err("preloading by path is only implemented on unix".into())
}
