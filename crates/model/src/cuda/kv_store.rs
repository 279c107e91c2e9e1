//! The model's own kernel, `kv_store.cu`: K/V rows into their pages as f16, generation-checked.
//!
//! Its PTX comes, like the kernels crate's, from a directory of precompiled files when one is
//! named (`PAGEWARDEN_MODEL_PTX_DIR`, else `PAGEWARDEN_PTX_DIR`, file `model_kv.ptx`; a machine
//! with only the driver needs this), or from NVRTC at load time. A file is refused unless its
//! header names the hash of the source embedded in this binary, so stale PTX never runs.

use std::path::{Path, PathBuf};

use pagewarden_kernels::cuda::cudarc::driver::{
    CudaFunction, CudaSlice, LaunchConfig, PushKernelArg,
};
use pagewarden_kernels::cuda::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use pagewarden_kernels::cuda::{ensure_nvrtc, load_ptx, CudaBackend, DeviceKvPool, PTX_DIR_ENV};

use super::error::{driver, GpuError};

/// The kernel source, embedded.
const SOURCE: &str = include_str!("kv_store.cu");
/// The kernel's name.
const KERNEL: &str = "kv_store_f16";
/// File name of the precompiled PTX.
pub const PTX_FILE: &str = "model_kv.ptx";
/// Environment variable naming a directory holding [`PTX_FILE`] (checked before
/// `PAGEWARDEN_PTX_DIR`).
pub const MODEL_PTX_DIR_ENV: &str = "PAGEWARDEN_MODEL_PTX_DIR";

/// FNV-1a of the embedded source (the same hash the kernels crate writes into its PTX headers).
fn source_hash() -> u64 {
    SOURCE.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn header_tag() -> String {
    format!("source={:016x}", source_hash())
}

/// Compiles `kv_store.cu` for `arch` (e.g. `compute_90`) with NVRTC; the text starts with the
/// header line that [`PTX_FILE`] readers check.
pub fn compile_kv_store(arch: &str) -> Result<String, GpuError> {
    ensure_nvrtc()?;
    let opts = CompileOptions {
        name: Some("kv_store.cu".into()),
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(SOURCE, opts)
        .map_err(|e| GpuError::Ptx(format!("NVRTC failed for {arch}: {e:?}")))?;
    Ok(format!(
        "// pagewarden-model-ptx module=kv_store arch={arch} {}\n{}",
        header_tag(),
        ptx.to_src()
    ))
}

/// Compiles and writes `dir/model_kv.ptx` for `arch`.
pub fn write_kv_store_ptx(dir: &Path, arch: &str) -> Result<PathBuf, GpuError> {
    let text = compile_kv_store(arch)?;
    let path = dir.join(PTX_FILE);
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, text))
        .map_err(|e| GpuError::Ptx(format!("writing {}: {e}", path.display())))?;
    Ok(path)
}

/// The precompiled PTX file to use, if a directory is named and holds one.
fn ptx_file() -> Option<PathBuf> {
    [MODEL_PTX_DIR_ENV, PTX_DIR_ENV]
        .iter()
        .filter_map(|v| std::env::var_os(v).filter(|d| !d.is_empty()))
        .map(|d| PathBuf::from(d).join(PTX_FILE))
        .find(|p| p.exists())
}

/// Reads a PTX file, refusing one built from another source.
fn read_checked(path: &Path) -> Result<String, GpuError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| GpuError::Ptx(format!("reading {}: {e}", path.display())))?;
    let first = text.lines().next().unwrap_or("");
    if !first.starts_with("// pagewarden-model-ptx ") || !first.contains(&header_tag()) {
        return Err(GpuError::Ptx(format!(
            "{} was built from another kv_store.cu (header {first:?}, expected {}); regenerate \
             it with `gpu_engine --write-ptx DIR`",
            path.display(),
            header_tag()
        )));
    }
    Ok(text)
}

/// The loaded kernel.
pub(crate) struct KvStore {
    func: CudaFunction,
}

/// One layer's K/V write: per row, where it goes and which sequence's flag it sets.
pub(crate) struct KvRows<'a> {
    pub seq: &'a CudaSlice<u32>,
    pub page: &'a CudaSlice<u32>,
    pub slot: &'a CudaSlice<u32>,
    pub gen: &'a CudaSlice<u64>,
    pub rows: usize,
}

impl KvStore {
    /// Loads the kernel from precompiled PTX or NVRTC.
    pub(crate) fn load(backend: &CudaBackend) -> Result<KvStore, GpuError> {
        let text = match ptx_file() {
            Some(path) => read_checked(&path)?,
            None => compile_kv_store(backend.arch())?,
        };
        // Lowers the PTX ISA version for a driver older than NVRTC, as the kernels crate does.
        let module = load_ptx(backend.context(), text)?;
        let func = module
            .load_function(KERNEL)
            .map_err(driver("looking up kv_store_f16"))?;
        Ok(KvStore { func })
    }

    /// Writes `k`/`v` rows (`rows * token_width` f32 each) of `layer` into the pool.
    // One argument per kernel operand: bundling them would only rename the launch signature.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store(
        &self,
        backend: &CudaBackend,
        pool: &mut DeviceKvPool,
        layer: usize,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        rows: &KvRows<'_>,
        flags: &mut CudaSlice<u32>,
    ) -> Result<(), GpuError> {
        let s = pool.shape;
        let tw = s.token_width();
        let n = rows.rows;
        if n == 0 {
            return Ok(());
        }
        assert!(
            k.len() >= n * tw && v.len() >= n * tw,
            "kv_store: k/v too short"
        );
        assert!(
            rows.seq.len() >= n && rows.page.len() >= n && rows.slot.len() >= n,
            "kv_store: row tables too short"
        );
        assert!(rows.gen.len() >= n, "kv_store: generations too short");
        let (n_pages, layer, layers) = (pool.pages as u32, layer as u32, s.layers as u32);
        let (ps, tw32) = (s.page_size as u32, tw as u32);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = backend.stream().launch_builder(&self.func);
        b.arg(&mut pool.data).arg(k).arg(v);
        b.arg(rows.seq).arg(rows.page).arg(rows.slot).arg(rows.gen);
        b.arg(&pool.generations).arg(&n_pages).arg(flags);
        b.arg(&layer).arg(&layers).arg(&ps).arg(&tw32);
        // SAFETY: k, v and the row tables were checked against `n` above; page ids are checked
        // against n_pages in the kernel, slots come from the host bookkeeping (< page_size),
        // and sequence indices from the step's own batch (< flags.len()).
        unsafe { b.launch(cfg) }.map_err(driver("launching kv_store_f16"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC comes from the nvidia-cuda-nvrtc-cu12 wheel (scripts/test.sh puts it on the path).
    #[test]
    fn kv_store_compiles_to_ptx_for_sm_90_and_round_trips_through_a_file() {
        let dir = std::env::temp_dir().join(format!("pw-model-ptx-{}", std::process::id()));
        let path = write_kv_store_ptx(&dir, "compute_90").unwrap_or_else(|e| panic!("{e}"));
        let text = read_checked(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(text.contains(".target sm_90"), "PTX is not for sm_90");
        assert!(text.contains(".entry kv_store_f16("), "kernel missing");
        // A file from another source is refused, never run.
        let stale = text.replacen(&header_tag(), "source=0000000000000000", 1);
        std::fs::write(&path, stale).unwrap();
        let err = read_checked(&path).unwrap_err().to_string();
        assert!(err.contains("another kv_store.cu"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
