//! Every CUDA kernel compiles to PTX for sm_90 with NVRTC (no GPU needed).
//!
//! NVRTC comes from the `nvidia-cuda-nvrtc-cu12` wheel (scripts/test.sh installs it and puts it
//! on LD_LIBRARY_PATH). When `PAGEWARDEN_PTX_DIR` is set, the PTX files are written there for
//! machines that have only the NVIDIA driver (scripts/gpu/run.sh builds and runs it).
#![cfg(feature = "cuda")]

use std::path::PathBuf;

use pagewarden_kernels::cuda::{
    compile, ensure_nvrtc, lower_ptx_isa, ptx_isa, read_ptx, write_ptx, CudaError, Module,
    DEFAULT_PTX_ARCH, PTX_DIR_ENV,
};

fn out_dir() -> PathBuf {
    match std::env::var_os(PTX_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => std::env::temp_dir().join(format!("pagewarden-ptx-{}", std::process::id())),
    }
}

#[test]
fn every_kernel_compiles_to_ptx_for_sm_90() {
    if let Err(e) = ensure_nvrtc() {
        panic!("{e}");
    }
    let dir = out_dir();
    for m in Module::ALL {
        let ptx = compile(m, DEFAULT_PTX_ARCH).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            ptx.contains(".target sm_90"),
            "{}: PTX is not for sm_90",
            m.name()
        );
        for f in m.functions() {
            assert!(
                ptx.contains(&format!(".entry {f}(")),
                "{}: kernel {f} missing from the PTX",
                m.name()
            );
        }
        // On a driver older than this NVRTC (CUDA 12.4, ISA 8.4, here) only the .version line
        // changes; newer PTX would be refused outright (CUDA_ERROR_UNSUPPORTED_PTX_VERSION).
        let isa = ptx_isa(&ptx).unwrap_or_else(|| panic!("{}: no .version line", m.name()));
        match lower_ptx_isa(&ptx, 12040) {
            Some(low) => {
                assert!(isa > (8, 4), "{}: lowered from {isa:?}", m.name());
                assert_eq!(ptx_isa(&low), Some((8, 4)));
                let back =
                    low.replacen(".version 8.4", &format!(".version {}.{}", isa.0, isa.1), 1);
                assert_eq!(back, ptx, "{}: more than the version changed", m.name());
            }
            None => assert!(isa <= (8, 4), "{}: ISA {isa:?} not lowered", m.name()),
        }
        let path = write_ptx(&dir, m, DEFAULT_PTX_ARCH, &ptx).unwrap_or_else(|e| panic!("{e}"));
        let (arch, back) = read_ptx(&dir, m).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(arch, DEFAULT_PTX_ARCH);
        assert!(back.ends_with(&ptx), "{} round trip", path.display());
    }
    eprintln!(
        "PTX for {} modules written to {}",
        Module::ALL.len(),
        dir.display()
    );
}

#[test]
fn stale_ptx_is_refused() {
    let dir = std::env::temp_dir().join(format!("pagewarden-stale-ptx-{}", std::process::id()));
    let m = Module::Pages;
    write_ptx(&dir, m, DEFAULT_PTX_ARCH, ".version 8.0\n").expect("write");
    let path = pagewarden_kernels::cuda::ptx_path(&dir, m);
    let text = std::fs::read_to_string(&path).expect("read");
    let forged = text.replacen("source=", "source=0", 1);
    std::fs::write(&path, forged).expect("write");
    match read_ptx(&dir, m) {
        Err(CudaError::Ptx { why, .. }) => assert!(why.contains("other kernel sources"), "{why}"),
        other => panic!("stale PTX accepted: {other:?}"),
    }
    std::fs::remove_dir_all(&dir).ok();
}
