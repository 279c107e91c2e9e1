//! `pagewarden bench engine`: engine throughput (tok/s) for llama-bench's tests: prefill of a
//! 512- and a 4,096-token prompt (`pp512`, `pp4096`), 128 decoded tokens from an empty context
//! (`tg128`) and after 4,096 tokens (`tg128@d4096`), per thread count. Prefill runs on the
//! weights packed as a prefill worker packs them (`Packing::Compute`), decode as a decode
//! worker does (`Packing::Bandwidth`).
//!
//! With `--llama-bench PATH` each measurement alternates with llama.cpp's `llama-bench` on the
//! same model, test and thread count (ours, theirs, ours, theirs, ...), and the ratio printed is
//! against the figure measured in that same round: the machine's load changes from minute to
//! minute, constants measured another day tell nothing. Without it, only our figures print.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use pagewarden_kernels::Isa;
use pagewarden_kvcache::{KvPool, Owner, PoolConfig, RequestId, TenantId, DEFAULT_PAGE_SIZE};
use pagewarden_model::{argmax, LoadOptions, Model, Packing};

/// Arguments of `pagewarden bench engine`.
#[derive(Debug, Args)]
pub struct BenchEngineArgs {
    /// GGUF model file, or a known model's name (`smollm2`, `gemma3-270m`), fetched when missing.
    #[arg(long, env = "PAGEWARDEN_MODEL", default_value = "smollm2")]
    pub model: PathBuf,
    /// Thread counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Tests, comma separated, in llama-bench's names: `ppN` (prefill N tokens), `tgN` (decode
    /// N tokens from an empty context), `tgN@dD` (decode N tokens after D tokens of context).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "pp512,tg128,pp4096,tg128@d4096"
    )]
    pub tests: Vec<String>,
    /// Rounds per (test, thread count); with `--llama-bench`, each round runs ours then theirs.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Path of llama.cpp's `llama-bench` binary: run it alternately with ours (`-fa 1`, one
    /// repetition per round) and print the ratio of each round.
    #[arg(long)]
    pub llama_bench: Option<PathBuf>,
    /// Prompt tokens per forward pass during prefill (the prefill worker's `--chunk-tokens`).
    #[arg(long, default_value_t = LoadOptions::default().prefill_chunk)]
    pub chunk: usize,
}

const TEXT: &str = "Disaggregated serving splits the prefill and decode phases of inference so \
that each runs on hardware sized for it. The key-value cache computed during prefill moves to \
the decode worker page by page, and every page carries a generation tag that attention checks. ";

/// One llama-bench style test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Test {
    /// Prefill of `n` tokens.
    Prefill { n: usize },
    /// `n` decode steps after `depth` tokens of context.
    Decode { n: usize, depth: usize },
}

impl Test {
    fn parse(s: &str) -> anyhow::Result<Test> {
        let s = s.trim();
        let num = |v: &str| {
            v.parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .with_context(|| format!("test {s:?}: {v:?} is not a positive count"))
        };
        if let Some(n) = s.strip_prefix("pp") {
            return Ok(Test::Prefill { n: num(n)? });
        }
        if let Some(rest) = s.strip_prefix("tg") {
            let (n, depth) = match rest.split_once("@d") {
                Some((n, d)) => (num(n)?, d.parse().context("depth")?),
                None => (num(rest)?, 0),
            };
            return Ok(Test::Decode { n, depth });
        }
        bail!("test {s:?}: expected ppN, tgN or tgN@dD")
    }

    fn name(&self) -> String {
        match *self {
            Test::Prefill { n } => format!("pp{n}"),
            Test::Decode { n, depth: 0 } => format!("tg{n}"),
            Test::Decode { n, depth } => format!("tg{n}@d{depth}"),
        }
    }

    /// llama-bench's arguments for this test.
    fn llama_args(&self) -> Vec<String> {
        let (p, n, d) = match *self {
            Test::Prefill { n } => (n, 0, 0),
            Test::Decode { n, depth } => (0, n, depth),
        };
        [
            "-p",
            &p.to_string(),
            "-n",
            &n.to_string(),
            "-d",
            &d.to_string(),
        ]
        .map(String::from)
        .to_vec()
    }
}

/// Runs `pagewarden bench engine`.
pub fn run(a: BenchEngineArgs) -> anyhow::Result<()> {
    // A file, or a known model's name fetched when missing (as `up` resolves it).
    let a = BenchEngineArgs {
        model: crate::fetch::resolve(&a.model)?,
        ..a
    };
    let tests = a
        .tests
        .iter()
        .map(|t| Test::parse(t))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    println!("model   {}", a.model.display());
    println!("cpu     {}", cpu_model());
    println!(
        "isa     {} (available: {}; cap with PAGEWARDEN_ISA=portable|avx2|avx512)",
        Isa::detect(),
        Isa::available()
            .iter()
            .map(|i| i.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "threads the caller plus N-1 spinning pool workers, placed by the OS (not pinned); \
         llama-bench -t N"
    );
    match &a.llama_bench {
        Some(p) => println!(
            "peer    {} -fa 1 -r 1, alternating with ours each round",
            p.display()
        ),
        None => println!("peer    none (pass --llama-bench PATH for same-run ratios)"),
    }
    println!(
        "{:>13} {:>7} {:>5} {:>12} {:>12} {:>7}",
        "test", "threads", "round", "ours tok/s", "l.cpp tok/s", "ratio"
    );
    for &threads in &a.threads {
        // Each test on the weights as its worker packs them: prefill's for compute, decode's
        // for the fewest bytes; a packing is loaded only when some test runs on it.
        let load = |packing, wanted: bool| {
            let opts = LoadOptions {
                prefill_chunk: a.chunk,
                threads,
                packing,
                ..LoadOptions::default()
            };
            wanted
                .then(|| {
                    Model::load(&a.model, &opts)
                        .with_context(|| format!("loading model {}", a.model.display()))
                })
                .transpose()
        };
        let prefills = tests.iter().any(|t| matches!(t, Test::Prefill { .. }));
        let decodes = tests.iter().any(|t| matches!(t, Test::Decode { .. }));
        let (prefill, decode) = (
            load(Packing::Compute, prefills)?,
            load(Packing::Bandwidth, decodes)?,
        );
        for test in &tests {
            let model = match test {
                Test::Prefill { .. } => prefill.as_ref(),
                Test::Decode { .. } => decode.as_ref(),
            }
            .expect("loaded for its tests");
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for round in 1..=a.rounds {
                let o = measure(model, *test)?;
                let t = match &a.llama_bench {
                    Some(p) => Some(llama_bench(p, &a.model, *test, threads)?),
                    None => None,
                };
                ours.push(o);
                theirs.extend(t);
                println!(
                    "{:>13} {:>7} {:>5} {:>12.1} {:>12} {:>7}",
                    test.name(),
                    threads,
                    round,
                    o,
                    t.map_or("-".into(), |t| format!("{t:.1}")),
                    t.map_or("-".into(), |t| format!("{:.2}x", o / t)),
                );
            }
            if a.rounds > 1 {
                let (mo, mt) = (median(&ours), (!theirs.is_empty()).then(|| median(&theirs)));
                println!(
                    "{:>13} {:>7} {:>5} {:>12.1} {:>12} {:>7}",
                    test.name(),
                    threads,
                    "med",
                    mo,
                    mt.map_or("-".into(), |t| format!("{t:.1}")),
                    mt.map_or("-".into(), |t| format!("{:.2}x", mo / t)),
                );
            }
        }
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

/// The CPU's model name and the SIMD flags that matter here (Linux; "unknown" elsewhere).
fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let flags = field("flags").unwrap_or_default();
    let simd: Vec<&str> = flags
        .split_whitespace()
        .filter(|f| {
            ["avx2", "fma", "f16c", "avx_vnni", "amx_int8"].contains(f) || f.starts_with("avx512")
        })
        .collect();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "{} ({} cpus, family {} model {}; {})",
        field("model name").unwrap_or_else(|| "unknown".into()),
        cpus,
        field("cpu family").unwrap_or_default(),
        field("model\t").unwrap_or_default(),
        simd.join(" ")
    )
}

/// Our tok/s for `test` (after one short warm-up run).
fn measure(model: &Model, test: Test) -> anyhow::Result<f64> {
    let (prompt_len, decode) = match test {
        Test::Prefill { n } => (n, 0),
        // Decode needs one token of context to start from, as llama-bench's does.
        Test::Decode { n, depth } => (depth.max(1), n),
    };
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
    // Warm up (page faults of the mapping, the pool's workers).
    let mut warm = pool.allocate(owner(), 16)?;
    model.prefill(&mut warm, &prompt[..16.min(prompt_len)])?;
    drop(warm);

    let mut seq = pool.allocate(owner(), total)?;
    let t = Instant::now();
    let mut logits = model.prefill(&mut seq, &prompt)?;
    let prefill_s = t.elapsed().as_secs_f64();
    if decode == 0 {
        return Ok(prompt_len as f64 / prefill_s);
    }
    let t = Instant::now();
    for _ in 0..decode {
        let tok = argmax(&logits);
        logits = model
            .decode_step(&mut [(&mut seq, tok)])
            .pop()
            .expect("one result")?;
    }
    Ok(decode as f64 / t.elapsed().as_secs_f64())
}

/// llama-bench's tok/s for `test` (one repetition, flash attention on).
fn llama_bench(
    bin: &std::path::Path,
    model: &std::path::Path,
    test: Test,
    threads: usize,
) -> anyhow::Result<f64> {
    let out = Command::new(bin)
        .arg("-m")
        .arg(model)
        .args([
            "-fa",
            "1",
            "-r",
            "1",
            "-o",
            "json",
            "-t",
            &threads.to_string(),
        ])
        .args(test.llama_args())
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    parse_llama_bench(&String::from_utf8_lossy(&out.stdout))
}

/// The `avg_ts` of the single result in llama-bench's JSON output.
fn parse_llama_bench(json: &str) -> anyhow::Result<f64> {
    let v: serde_json::Value =
        serde_json::from_str(json.trim()).context("llama-bench printed no JSON")?;
    v.as_array()
        .and_then(|a| a.first())
        .and_then(|r| r.get("avg_ts"))
        .and_then(|t| t.as_f64())
        .context("llama-bench JSON has no avg_ts")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_parse_like_llama_bench_names() {
        assert_eq!(Test::parse("pp512").unwrap(), Test::Prefill { n: 512 });
        assert_eq!(
            Test::parse("tg128").unwrap(),
            Test::Decode { n: 128, depth: 0 }
        );
        let d = Test::parse("tg128@d4096").unwrap();
        assert_eq!(
            d,
            Test::Decode {
                n: 128,
                depth: 4096
            }
        );
        assert_eq!(d.name(), "tg128@d4096");
        assert_eq!(d.llama_args(), ["-p", "0", "-n", "128", "-d", "4096"]);
        for bad in ["", "pp", "pp0", "tgx", "xx12", "tg12@d"] {
            assert!(Test::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn llama_bench_json_gives_avg_ts() {
        let j = r#"[{"n_prompt": 512, "n_gen": 0, "avg_ts": 143.25, "stddev_ts": 0.0}]"#;
        assert_eq!(parse_llama_bench(j).unwrap(), 143.25);
        assert!(parse_llama_bench("[]").is_err());
        assert!(parse_llama_bench("not json").is_err());
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0]), 2.5);
    }
}
