//! `pagewarden bench engine`: prefill tok/s for a 512-token prompt and decode tok/s for 128
//! tokens, per thread count, plus how much of each is spent in the weight matmuls.
//! Ratios are against llama.cpp on this machine class (1 thread: 172 prefill, 75 decode).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use pagewarden_kvcache::{KvPool, Owner, PoolConfig, RequestId, TenantId, DEFAULT_PAGE_SIZE};
use pagewarden_model::{argmax, LoadOptions, Model};

/// llama.cpp, SmolLM2-135M Q4_1, 1 thread, this machine class.
const LLAMA_CPP_PREFILL: f64 = 172.0;
const LLAMA_CPP_DECODE: f64 = 75.0;

/// Arguments of `pagewarden bench engine`.
#[derive(Debug, Args)]
pub struct BenchEngineArgs {
    /// GGUF model file.
    #[arg(
        long,
        env = "PAGEWARDEN_MODEL",
        default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    )]
    pub model: PathBuf,
    /// Thread counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens generated for the decode measurement.
    #[arg(long, default_value_t = 128)]
    pub decode_tokens: usize,
}

const TEXT: &str = "Disaggregated serving splits the prefill and decode phases of inference so \
that each runs on hardware sized for it. The key-value cache computed during prefill moves to \
the decode worker page by page, and every page carries a generation tag that attention checks. ";

/// Runs `pagewarden bench engine`.
pub fn run(a: BenchEngineArgs) -> anyhow::Result<()> {
    println!(
        "model {}  prompt {} tokens  decode {} tokens",
        a.model.display(),
        a.prompt_tokens,
        a.decode_tokens
    );
    println!(
        "{:>7} {:>14} {:>9} {:>13} {:>9} {:>15} {:>15}",
        "threads",
        "prefill tok/s",
        "vs l.cpp",
        "decode tok/s",
        "vs l.cpp",
        "prefill matmul",
        "decode matmul"
    );
    for &threads in &a.threads {
        let opts = LoadOptions {
            threads,
            ..LoadOptions::default()
        };
        let model = Model::load(&a.model, &opts)
            .with_context(|| format!("loading model {}", a.model.display()))?;
        let r = measure(&model, a.prompt_tokens, a.decode_tokens)?;
        let (pre, dec) = (
            a.prompt_tokens as f64 / r.prefill_s,
            a.decode_tokens as f64 / r.decode_s,
        );
        println!(
            "{:>7} {:>14.1} {:>8.2}x {:>13.1} {:>8.2}x {:>14.0}% {:>14.0}%",
            threads,
            pre,
            pre / LLAMA_CPP_PREFILL,
            dec,
            dec / LLAMA_CPP_DECODE,
            100.0 * r.prefill_matmul_s / r.prefill_s,
            100.0 * r.decode_matmul_s / r.decode_s,
        );
    }
    println!(
        "(vs l.cpp: ratio to llama.cpp at 1 thread, {LLAMA_CPP_PREFILL} prefill / \
         {LLAMA_CPP_DECODE} decode tok/s; matmul %: share of the time spent in weight matmuls, \
         the rest is attention, norms, RoPE, activation quantization and KV page I/O)"
    );
    Ok(())
}

struct Measured {
    prefill_s: f64,
    decode_s: f64,
    prefill_matmul_s: f64,
    decode_matmul_s: f64,
}

fn measure(model: &Model, prompt_len: usize, decode: usize) -> anyhow::Result<Measured> {
    let mut prompt = Vec::new();
    while prompt.len() < prompt_len {
        prompt.extend(model.tokenizer().encode(TEXT, false));
    }
    prompt.truncate(prompt_len);
    let total = prompt_len + decode + 1;
    let layout = model.kv_layout(DEFAULT_PAGE_SIZE);
    let pool = KvPool::new(PoolConfig::with_pages(layout, layout.pages_for(total) * 2));
    let owner = || Owner {
        request: RequestId::random(),
        tenant: TenantId::new("bench"),
    };
    // Warm up (page faults of the mapping, thread pool start).
    let mut warm = pool.allocate(owner(), 16)?;
    model.prefill(&mut warm, &prompt[..16.min(prompt_len)])?;
    drop(warm);

    let mut seq = pool.allocate(owner(), total)?;
    let t = Instant::now();
    let mut logits = model.prefill(&mut seq, &prompt)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..decode {
        let tok = argmax(&logits);
        logits = model
            .decode_step(&mut [(&mut seq, tok)])
            .pop()
            .expect("one result")?;
    }
    let decode_s = t.elapsed().as_secs_f64();
    Ok(Measured {
        prefill_s,
        decode_s,
        prefill_matmul_s: matmul_time(model, prompt_len, false),
        decode_matmul_s: matmul_time(model, 1, true) * decode as f64,
    })
}

/// Time of the weight matmuls alone for `rows` tokens (plus the output head for one row).
fn matmul_time(model: &Model, rows: usize, _decode: bool) -> f64 {
    use pagewarden_kernels::{matmul, Parallel};
    let par = Parallel::new(model.threads());
    let w = model.weights();
    let cfg = model.config();
    let x: Vec<f32> = (0..rows * cfg.ffn.max(cfg.dim))
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let mut out = vec![0f32; rows * cfg.ffn.max(cfg.dim).max(cfg.vocab)];
    let t = Instant::now();
    for l in &w.layers {
        for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down] {
            matmul(
                m,
                &x[..rows * m.cols],
                rows,
                &mut out[..rows * m.rows],
                &par,
            );
        }
    }
    let head = &w.output;
    matmul(head, &x[..head.cols], 1, &mut out[..head.rows], &par);
    t.elapsed().as_secs_f64()
}
