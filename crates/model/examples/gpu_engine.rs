//! GPU engine check (run by scripts/gpu/run.sh on a machine with an NVIDIA GPU):
//!
//! 1. parity: for every reference case, GPU prefill vs llama.cpp's top-5 logits and top-1, GPU
//!    vs CPU logits, and 24 greedy GPU tokens vs llama.cpp's and the CPU engine's (with
//!    `--prompts`, a file whose llama.cpp figures are not this model's, only the CPU engine's);
//! 2. a generation-mismatch step: one sequence's table presents a generation its page no longer
//!    has, so the next batched decode step must fail that sequence with an error while its
//!    batch mate proceeds;
//! 3. prefill tok/s (512-token prompt) and decode tok/s at batch 1, 8 and 32.
//!
//! `gpu_engine --model PATH (--reference JSON | --prompts JSON) [--device cuda:N]`, or
//! `gpu_engine --write-ptx DIR [--arch compute_90]` to precompile the model's own kernel (needs
//! NVRTC; the GPU machine then needs only the driver). Exits non-zero when a check fails.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use pagewarden_kernels::Device;
use pagewarden_kvcache::{
    Generation, KvPool, Owner, PoolConfig, ReadablePages, RequestId, SharedPages, TenantId,
};
use pagewarden_model::cuda::{GpuWorker, GpuWorkerOptions};
use pagewarden_model::{argmax, LoadOptions, Model, ModelError};

/// Pages of the host pool the GPU mirrors, and their size in tokens.
const PAGES: usize = 2048;
const PAGE_SIZE: usize = 16;

/// Greedy tokens decoded per parity case.
const GREEDY: usize = 24;
/// Leading greedy tokens that must match on at least `cases - 1` cases.
const MIN_PREFIX: usize = 8;

struct Args {
    model: Option<PathBuf>,
    reference: Option<PathBuf>,
    /// The cases' llama.cpp figures are not this model's: compare with the CPU engine only.
    cpu_only: bool,
    device: Device,
    write_ptx: Option<PathBuf>,
    arch: String,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        model: None,
        reference: None,
        cpu_only: false,
        device: Device::Cuda(0),
        write_ptx: None,
        arch: "compute_90".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.model = Some(val()?.into()),
            "--reference" => a.reference = Some(val()?.into()),
            "--prompts" => {
                a.reference = Some(val()?.into());
                a.cpu_only = true;
            }
            "--device" => a.device = val()?.parse()?,
            "--write-ptx" => a.write_ptx = Some(val()?.into()),
            "--arch" => a.arch = val()?,
            other => bail!(
                "unknown argument {other:?}; usage: gpu_engine --model PATH (--reference JSON | \
                 --prompts JSON) [--device cuda:N] | --write-ptx DIR [--arch compute_90]"
            ),
        }
    }
    Ok(a)
}

struct Case {
    prompt: Vec<u32>,
    top5: Vec<(u32, f32)>,
    greedy: Vec<u32>,
}

fn load_cases(path: &PathBuf) -> Result<Vec<Case>> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_slice(&text).context("reference is not JSON")?;
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as u32)
                    .collect()
            })
            .unwrap_or_default()
    };
    let cases = json["cases"]
        .as_array()
        .context("reference has no cases array")?;
    Ok(cases
        .iter()
        .map(|c| Case {
            prompt: ids(&c["prompt_tokens"]),
            greedy: ids(&c["greedy_tokens"]),
            top5: c["first_step_top5"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|e| {
                            let t = e["token"].as_u64().unwrap_or(0) as u32;
                            (t, e["logit"].as_f64().unwrap_or(f64::NAN) as f32)
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect())
}

/// The GPU worker and the host pool whose pages it mirrors.
struct Gpu {
    worker: GpuWorker,
    pool: KvPool,
}

impl Gpu {
    /// A new, empty sequence of the host pool (pages are allocated as it grows).
    fn new_sequence(&self) -> Result<ReadablePages> {
        let owner = Owner {
            request: RequestId::random(),
            tenant: TenantId::new("gpu-engine"),
        };
        Ok(self.pool.allocate(owner, 0)?)
    }

    fn prefill(&mut self, seq: &mut ReadablePages, tokens: &[u32]) -> Result<Vec<f32>> {
        self.worker
            .prefill(None, seq, tokens)
            .context("GPU prefill")
    }

    fn decode(&mut self, seq: &mut ReadablePages, token: u32) -> Result<Vec<f32>> {
        let mut out = self.worker.decode_step(&mut [(None, seq, token)]);
        out.pop().expect("one result").context("GPU decode")
    }
}

/// The CPU engine's logits before each of its first `n` greedy tokens, and those tokens.
fn cpu_greedy(
    model: &Model,
    pool: &KvPool,
    prompt: &[u32],
    n: usize,
) -> Result<(Vec<Vec<f32>>, Vec<u32>)> {
    let owner = Owner {
        request: RequestId::random(),
        tenant: TenantId::new("gpu-parity"),
    };
    let mut seq = pool.allocate(owner, prompt.len())?;
    let mut steps = vec![model.prefill(&mut seq, prompt)?];
    let mut tokens = vec![argmax(&steps[0])];
    while tokens.len() < n {
        let t = *tokens.last().expect("one token");
        let logits = model
            .decode_step(&mut [(&mut seq, t)])
            .pop()
            .expect("one result")?;
        tokens.push(argmax(&logits));
        steps.push(logits);
    }
    Ok((steps, tokens))
}

fn parity(model: &Model, gpu: &mut Gpu, cases: &[Case], cpu_only: bool) -> Result<bool> {
    let pool = KvPool::new(PoolConfig::with_pages(model.kv_layout(16), 256));
    if cpu_only {
        println!("== parity: GPU vs the CPU engine (the prompts' llama.cpp figures are not this model's)");
    } else {
        println!("== parity: GPU vs llama.cpp reference and vs the CPU engine");
    }
    println!(
        "{:>4} {:>6} {:>10} {:>6} {:>12} {:>10} {:>10}",
        "case", "prompt", "top5 |d|", "top1", "GPU-CPU |d|", "greedy", "vs CPU"
    );
    let (mut top1_all, mut prefix_ok, mut worst, mut worst_cpu) = (true, 0, 0f32, 0f32);
    for (ci, c) in cases.iter().enumerate() {
        let mut seq = gpu.new_sequence()?;
        let mut logits = gpu.prefill(&mut seq, &c.prompt)?;
        let n = if cpu_only {
            GREEDY
        } else {
            GREEDY.min(c.greedy.len())
        };
        let (cpu_steps, cpu_tokens) = cpu_greedy(model, &pool, &c.prompt, n)?;
        let cpu = &cpu_steps[0];
        let top5_d = if cpu_only {
            f32::NAN
        } else {
            c.top5
                .iter()
                .map(|&(t, want)| (logits[t as usize] - want).abs())
                .fold(0f32, f32::max)
        };
        let want_top1 = if cpu_only {
            Some(argmax(cpu))
        } else {
            c.top5.first().map(|t| t.0)
        };
        let top1 = want_top1 == Some(argmax(&logits));
        let cpu_d = cpu
            .iter()
            .zip(&logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let mut ours = Vec::with_capacity(n);
        while ours.len() < n {
            let t = argmax(&logits);
            ours.push(t);
            if ours.len() < n {
                logits = gpu.decode(&mut seq, t)?;
            }
        }
        drop(seq);
        let run = |want: &[u32]| ours.iter().zip(want).take_while(|(a, b)| a == b).count();
        let (matched, matched_cpu) = (
            run(if cpu_only { &cpu_tokens } else { &c.greedy }),
            run(&cpu_tokens),
        );
        println!(
            "{ci:>4} {:>6} {top5_d:>10.4} {:>6} {cpu_d:>12.4} {:>7}/{n} {:>7}/{n}",
            c.prompt.len(),
            if top1 { "ok" } else { "DIFF" },
            matched,
            matched_cpu
        );
        top1_all &= top1;
        prefix_ok += usize::from(matched >= MIN_PREFIX.min(n));
        if matched_cpu < n {
            // Where the GPU's greedy path leaves the CPU's: how far apart the two picks were in
            // the CPU's own logits (a near-tie is what arithmetic differences can flip).
            let step = &cpu_steps[matched_cpu];
            let (mine, theirs) = (cpu_tokens[matched_cpu], ours[matched_cpu]);
            println!(
                "      case {ci} leaves the CPU's path at token {matched_cpu}: CPU picks {mine}, \
                 GPU {theirs}; their CPU logits differ by {:.4} (the CPU's top logit {:.2})",
                step[mine as usize] - step[theirs as usize],
                step[mine as usize]
            );
        }
        if !cpu_only {
            worst = worst.max(top5_d);
        }
        worst_cpu = worst_cpu.max(cpu_d);
    }
    let pass = top1_all && prefix_ok + 1 >= cases.len();
    println!(
        "parity: top-1 {} on all cases; {prefix_ok}/{} cases match the first {MIN_PREFIX} greedy \
         tokens of {}; worst top-5 logit |d| {worst:.4}; worst GPU-CPU logit |d| {worst_cpu:.4}  => {}",
        if top1_all { "matches" } else { "DIFFERS" },
        cases.len(),
        if cpu_only { "the CPU engine" } else { "llama.cpp" },
        if pass { "PASS" } else { "FAIL" }
    );
    Ok(pass)
}

fn mismatch_check(gpu: &mut Gpu, prompt: &[u32]) -> Result<bool> {
    println!("== generation mismatch: A's table presents a generation its page no longer has");
    let (mut a, mut b) = (gpu.new_sequence()?, gpu.new_sequence()?);
    let ta = argmax(&gpu.prefill(&mut a, prompt)?);
    let tb = argmax(&gpu.prefill(&mut b, prompt)?);
    let (len_a, len_b) = (a.len(), b.len());
    let (page, g) = a.table()[0];
    a.test_set_table_generation(0, Generation(g.0 + 1));
    println!(
        "page {} of A: the pool's generation {}, A presents {}",
        page.0,
        g.0,
        g.0 + 1
    );
    let mut res = gpu
        .worker
        .decode_step(&mut [(None, &mut a, ta), (None, &mut b, tb)]);
    let rb = res.pop().expect("two results");
    let ra = res.pop().expect("two results");
    // Refused on the device (the attention and K/V-store kernels' check) or, for a page the
    // device does not hold at that generation, by the host pool before it is copied over.
    let a_refused = matches!(
        &ra,
        Err(pagewarden_model::cuda::GpuError::Model(
            ModelError::DevicePageFault(_)
        )) | Err(pagewarden_model::cuda::GpuError::HostRead(_))
    );
    let b_ok = matches!(&rb, Ok(l) if l.iter().all(|x| x.is_finite()));
    match &ra {
        Ok(_) => println!("A: returned logits (WRONG: a stale page table was accepted)"),
        Err(e) => println!("A: error: {e}"),
    }
    match &rb {
        Ok(l) => println!("B: ok, next token {}", argmax(l)),
        Err(e) => println!("B: error: {e} (WRONG: its batch mate's fault leaked)"),
    }
    let lens = a.len() == len_a && b.len() == len_b + 1;
    let pass = a_refused && b_ok && lens;
    println!(
        "mismatch check: A refused {a_refused}, B proceeded {b_ok}, lengths right {lens} => {}",
        if pass { "PASS" } else { "FAIL" }
    );
    Ok(pass)
}

fn prompt_of(base: &[u32], len: usize, shift: usize) -> Vec<u32> {
    (0..len).map(|i| base[(i + shift) % base.len()]).collect()
}

/// Prefills `batch` sequences of `prompt_len` tokens, then runs `steps` greedy decode steps
/// over all of them together. Returns decode tokens per second, all sequences together.
fn decode_bench(
    gpu: &mut Gpu,
    base: &[u32],
    batch: usize,
    prompt_len: usize,
    steps: usize,
) -> Result<f64> {
    let mut seqs: Vec<ReadablePages> = Vec::with_capacity(batch);
    let mut next = Vec::with_capacity(batch);
    for s in 0..batch {
        let mut seq = gpu.new_sequence()?;
        let l = gpu.prefill(&mut seq, &prompt_of(base, prompt_len, s))?;
        next.push(argmax(&l));
        seqs.push(seq);
    }
    let t0 = Instant::now();
    for _ in 0..steps {
        let mut work: Vec<(Option<&SharedPages>, &mut ReadablePages, u32)> = seqs
            .iter_mut()
            .zip(next.iter().copied())
            .map(|(s, t)| (None, s, t))
            .collect();
        let res = gpu.worker.decode_step(&mut work);
        for (n, r) in next.iter_mut().zip(res) {
            *n = argmax(&r.context("bench decode")?);
        }
    }
    // Each step reads its logits back, so the device is idle here.
    Ok((batch * steps) as f64 / t0.elapsed().as_secs_f64())
}

fn bench(gpu: &mut Gpu, base: &[u32]) -> Result<()> {
    println!("== throughput");
    let prompt = prompt_of(base, 512, 0);
    let mut warm = gpu.new_sequence()?;
    gpu.prefill(&mut warm, &prompt[..64])?;
    drop(warm);
    let mut seq = gpu.new_sequence()?;
    let t0 = Instant::now();
    gpu.prefill(&mut seq, &prompt)?;
    let secs = t0.elapsed().as_secs_f64();
    drop(seq);
    println!(
        "prefill 512 tokens: {:.1} ms, {:.0} tok/s",
        secs * 1e3,
        512.0 / secs
    );
    for batch in [1usize, 8, 32] {
        let total = decode_bench(gpu, base, batch, 64, 128)?;
        println!(
            "decode batch {batch:>2} (64-token prompts, 128 steps): {:.1} tok/s per sequence, \
             {total:.1} tok/s total",
            total / batch as f64
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = parse_args()?;
    if let Some(dir) = &args.write_ptx {
        let path = pagewarden_model::cuda::write_kv_store_ptx(dir, &args.arch)?;
        println!("wrote {}", path.display());
        return Ok(());
    }
    let ordinal = match args.device {
        Device::Cuda(n) => n,
        Device::Cpu => bail!("gpu_engine runs on a GPU: pass --device cuda:N"),
    };
    let model_path = args.model.context("--model PATH is required")?;
    let ref_path = args
        .reference
        .context("--reference JSON or --prompts JSON is required")?;
    let cases = load_cases(&ref_path)?;
    if cases.is_empty() {
        bail!("{} has no cases", ref_path.display());
    }
    let t0 = Instant::now();
    let opts = LoadOptions {
        prefill_chunk: 512,
        ..LoadOptions::default()
    };
    let model = Arc::new(
        Model::load(&model_path, &opts)
            .with_context(|| format!("loading {}", model_path.display()))?,
    );
    let pool = KvPool::new(PoolConfig::with_pages(model.kv_layout(PAGE_SIZE), PAGES));
    let gpu_opts = GpuWorkerOptions {
        device: ordinal,
        staging_pages: 64,
        zero_new_pages: true,
    };
    let worker = match GpuWorker::new(model.clone(), pool.clone(), &gpu_opts) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("gpu_engine: cannot run on cuda:{ordinal}: {e}");
            std::process::exit(2);
        }
    };
    println!("device {}: {}", args.device, worker.describe());
    let mut gpu = Gpu { worker, pool };
    println!(
        "model loaded and uploaded in {:.0} ms ({} layers, dim {}, vocab {}; {PAGES} pages of \
         {PAGE_SIZE} tokens)",
        t0.elapsed().as_secs_f64() * 1e3,
        model.config().layers,
        model.config().dim,
        model.config().vocab,
    );
    let parity_ok = parity(&model, &mut gpu, &cases, args.cpu_only)?;
    let mismatch_ok = mismatch_check(&mut gpu, &cases[0].prompt)?;
    let base: Vec<u32> = cases
        .iter()
        .flat_map(|c| c.prompt.iter().copied())
        .collect();
    bench(&mut gpu, &base)?;
    println!("total {:.1} s", t0.elapsed().as_secs_f64());
    if !(parity_ok && mismatch_ok) {
        bail!("GPU engine check FAILED (parity {parity_ok}, mismatch check {mismatch_ok})");
    }
    println!("GPU engine check PASSED");
    Ok(())
}
