//! Engine throughput without the CLI: prefill tok/s for a 512-token prompt and decode tok/s
//! for 128 tokens, at 1 and 2 kernel threads, each the median of `RUNS` runs (the machine is
//! shared and noisy). `cargo bench -p pagewarden-model --bench engine`; env PAGEWARDEN_MODEL
//! names the GGUF file, BENCH_RUNS / BENCH_THREADS override the defaults. It reports, it never
//! asserts a speed.

use std::time::Instant;

use pagewarden_kvcache::{KvPool, Owner, PoolConfig, RequestId, TenantId};
use pagewarden_model::{argmax, LoadOptions, Model};

const PROMPT: usize = 512;
const DECODE: usize = 128;
const RUNS: usize = 5;

const TEXT: &str = "Disaggregated serving splits the prefill and decode phases of inference so \
that each runs on hardware sized for it. The key-value cache computed during prefill moves to \
the decode worker page by page, and every page carries a generation tag that attention checks. ";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let path = std::env::var("PAGEWARDEN_MODEL")
        .unwrap_or_else(|_| "../../models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(RUNS);
    let threads: Vec<usize> = std::env::var("BENCH_THREADS")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .filter_map(|t| t.parse().ok())
        .collect();
    for &t in &threads {
        let opts = LoadOptions {
            threads: t,
            ..LoadOptions::default()
        };
        let model = Model::load(path.as_ref(), &opts).expect("model loads (set PAGEWARDEN_MODEL)");
        let mut prompt = Vec::new();
        while prompt.len() < PROMPT {
            prompt.extend(model.tokenizer().encode(TEXT, false));
        }
        prompt.truncate(PROMPT);
        let layout = model.kv_layout(16);
        let pool = KvPool::new(PoolConfig::with_pages(
            layout,
            2 * layout.pages_for(PROMPT + DECODE + 1),
        ));
        let (mut pre, mut dec) = (Vec::new(), Vec::new());
        for _ in 0..runs + 1 {
            let owner = Owner {
                request: RequestId::random(),
                tenant: TenantId::new("bench"),
            };
            let mut seq = pool.allocate(owner, PROMPT + DECODE + 1).unwrap();
            let s = Instant::now();
            let mut logits = model.prefill(&mut seq, &prompt).unwrap();
            pre.push(PROMPT as f64 / s.elapsed().as_secs_f64());
            let s = Instant::now();
            for _ in 0..DECODE {
                let tok = argmax(&logits);
                logits = model
                    .decode_step(&mut [(&mut seq, tok)])
                    .pop()
                    .unwrap()
                    .unwrap();
            }
            dec.push(DECODE as f64 / s.elapsed().as_secs_f64());
        }
        // The first run warms the mapping and the pool.
        pre.remove(0);
        dec.remove(0);
        println!(
            "threads {t}: prefill {PROMPT} tok {:.1} tok/s (runs {:?})  decode {DECODE} tok {:.1} tok/s (runs {:?})",
            median(pre.clone()),
            pre.iter().map(|v| v.round()).collect::<Vec<_>>(),
            median(dec.clone()),
            dec.iter().map(|v| v.round()).collect::<Vec<_>>(),
        );
    }
}
