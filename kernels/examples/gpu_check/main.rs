//! GPU check: every CUDA kernel against the CPU reference on random inputs, the attention
//! generation check, and decode-shaped benchmarks. Run on a GPU machine:
//!
//! ```text
//! cargo run --release -p pagewarden-kernels --features cuda --example gpu_check [-- cuda:N]
//! ```
//!
//! or from the prebuilt binary scripts/gpu/run.sh carries. Without NVRTC on the machine, set
//! `PAGEWARDEN_PTX_DIR` to the PTX files the `cuda_ptx` test wrote (the driver JIT-compiles
//! them). Exits non-zero if any check fails. Seeded: every run uses the same inputs.

mod bench;
mod math;
mod paged;
mod report;

use std::time::Instant;

use anyhow::{bail, Context, Result};
use pagewarden_kernels::cuda::{CudaBackend, PtxSource};
use pagewarden_kernels::{Device, Parallel};

/// splitmix64: seeded inputs without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
}

fn main() -> Result<()> {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "cuda:0".into());
    let ordinal = match arg.parse::<Device>()? {
        Device::Cuda(n) => n,
        Device::Cpu => bail!("gpu_check compares the GPU with the CPU: give cuda:N, not cpu"),
    };
    let t0 = Instant::now();
    let gpu = CudaBackend::new(ordinal).context("opening the GPU")?;
    let source = match gpu.ptx_source() {
        PtxSource::Nvrtc => "NVRTC at run time".to_string(),
        PtxSource::Dir(d) => format!("precompiled PTX from {}", d.display()),
    };
    let driver = pagewarden_kernels::cuda::driver_version()?;
    println!(
        "device cuda:{ordinal}: {} ({}), driver CUDA {}.{}, kernels: {source}",
        gpu.name()?,
        gpu.arch(),
        driver / 1000,
        (driver % 1000) / 10
    );
    let t = Instant::now();
    gpu.load_all().context("loading the kernels")?;
    println!(
        "loaded every kernel module in {:.0} ms\n",
        t.elapsed().as_secs_f64() * 1e3
    );

    let par = Parallel::new(0);
    let mut rng = Rng(0x5eed_0009);
    let mut rows = Vec::new();
    // Sections run in order; if one fails (a launch error poisons the context), the rows so far
    // are still printed and the error names the section.
    let run = (|| -> Result<()> {
        math::matmuls(&gpu, &par, &mut rng, &mut rows).context("matmul / get_rows checks")?;
        math::elementwise(&gpu, &mut rng, &mut rows).context("elementwise checks")?;
        paged::attention(&gpu, &par, &mut rng, &mut rows).context("attention / page checks")
    })();
    let failed = report::print(&rows);
    println!("\n{} checks, {failed} failed", rows.len());
    run?;

    println!("\nCPU reference threads: {}", par.threads());
    bench::matvec(&gpu, &par, &mut rng)?;
    bench::decode_step(&gpu, &mut rng)?;
    println!("\ntotal {:.1} s", t0.elapsed().as_secs_f64());
    if failed > 0 {
        bail!("{failed} GPU check(s) failed");
    }
    Ok(())
}
