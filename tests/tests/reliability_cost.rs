//! What the defenses cost: the same build with every check on beside the test-only
//! switches off, alternating rounds in one run, reporting medians and on/off ratios. Asserts
//! nothing about speed (benchmarks, run by hand):
//!
//! - `defenses_cost_with_the_real_model`: the serve path a user pays for, in one process:
//!   router and worker admission, decode reserve + grant, the real model's prefill (from
//!   `PAGEWARDEN_MODEL`) into prefill's pool, every page sent over the memory transfer backend
//!   with real frames and checksums into decode's granted pages, commit verification, then
//!   greedy decode steps reading KV only through decode's generation-checked pages.
//! - `defenses_cost_on_vs_off`: the same path with synthetic 1 KiB pages and no model: the
//!   checks' cost against nothing but bookkeeping, an upper bound no user sees.
//!
//! Run: `cargo test -p pagewarden-system-tests --release --test reliability_cost -- --ignored
//! --nocapture --test-threads 1`.

#[allow(dead_code)]
#[path = "../src/harness/mod.rs"]
mod harness;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use harness::cluster::Cluster;
use harness::layers::Layers;
use harness::markers::{contains_marker, A};
use pagewarden_common::admission::Admission;
use pagewarden_kvcache::{
    page_checksum, CommitManifest, KvPool, Owner, PoolConfig, RequestId, TenantId,
    DEFAULT_PAGE_SIZE,
};
use pagewarden_model::{argmax, LoadOptions, Model};
use pagewarden_transfer::{
    BatchStatus, EngineConfig, MemoryBackend, PageSink, PageWriteReq, SegmentId, TransferBackend,
};

/// Alternating (on, off) pairs after one warm-up pair.
const PAIRS: usize = 7;

/// Median of `xs` (sorted in place).
fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// One round's figures: requests (or tokens) per second and mean time to first token (wall
/// clock), and process CPU seconds per request (or token), which a loaded machine disturbs
/// far less than wall time.
#[derive(Clone, Copy, Debug)]
struct Round {
    throughput: f64,
    ttft: Duration,
    cpu_per_unit: f64,
    /// Process CPU seconds up to the first token, per request (requests run one at a time).
    cpu_ttft: f64,
}

/// User + system CPU time of this process so far (all threads, `/proc/self/stat`, in clock
/// ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of proc(5), counted from `state` (field 3) here.
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    ticks as f64 / 100.0
}

/// Runs `PAIRS` alternating pairs (the order inside a pair alternates too, so neither side
/// always runs second) and prints medians and the median of the per-pair ratios.
async fn compare<F, Fut>(what: &str, unit: &str, mut round: F)
where
    F: FnMut(Layers) -> Fut,
    Fut: std::future::Future<Output = Round>,
{
    round(Layers::all_on()).await; // warm-up: page faults, caches, thread pools
    round(Layers::all_off()).await;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for i in 0..PAIRS {
        let (a, b) = if i % 2 == 0 {
            let a = round(Layers::all_on()).await;
            (a, round(Layers::all_off()).await)
        } else {
            let b = round(Layers::all_off()).await;
            (round(Layers::all_on()).await, b)
        };
        println!(
            "{what} pair {i}: on {:.2} {unit} ttft {:.3} ms (cpu {:.1} ms) cpu/unit {:.3} ms | \
             off {:.2} {unit} ttft {:.3} ms (cpu {:.1} ms) cpu/unit {:.3} ms",
            a.throughput,
            a.ttft.as_secs_f64() * 1e3,
            a.cpu_ttft * 1e3,
            a.cpu_per_unit * 1e3,
            b.throughput,
            b.ttft.as_secs_f64() * 1e3,
            b.cpu_ttft * 1e3,
            b.cpu_per_unit * 1e3
        );
        on.push(a);
        off.push(b);
    }
    let col = |v: &[Round], f: fn(&Round) -> f64| v.iter().map(f).collect::<Vec<f64>>();
    let tput = |r: &Round| r.throughput;
    let ttft = |r: &Round| r.ttft.as_secs_f64() * 1e3;
    let mut tput_ratio: Vec<f64> = on
        .iter()
        .zip(&off)
        .map(|(a, b)| a.throughput / b.throughput)
        .collect();
    let mut cpu_ratio: Vec<f64> = on
        .iter()
        .zip(&off)
        .map(|(a, b)| a.cpu_per_unit / b.cpu_per_unit)
        .collect();
    let mut cpu_ttft_ratio: Vec<f64> = on
        .iter()
        .zip(&off)
        .map(|(a, b)| a.cpu_ttft / b.cpu_ttft)
        .collect();
    let mut ttft_ratio: Vec<f64> = on
        .iter()
        .zip(&off)
        .map(|(a, b)| a.ttft.as_secs_f64() / b.ttft.as_secs_f64())
        .collect();
    println!(
        "{what}: median throughput on {:.2} / off {:.2} {unit}; median TTFT on {:.3} / off {:.3} ms",
        median(&mut col(&on, tput)),
        median(&mut col(&off, tput)),
        median(&mut col(&on, ttft)),
        median(&mut col(&off, ttft)),
    );
    println!(
        "{what}: median per-pair ratio on/off: throughput {:.4}, TTFT {:.4}, CPU per unit {:.4}, \
         CPU to first token {:.4} ({PAIRS} pairs)",
        median(&mut tput_ratio),
        median(&mut ttft_ratio),
        median(&mut cpu_ratio),
        median(&mut cpu_ttft_ratio)
    );
}

/// The in-process serve path over the real model (see the module doc).
struct RealPath {
    model: Arc<Model>,
    layers: Layers,
    decode: Arc<KvPool>,
    prefill: Arc<KvPool>,
    backend: MemoryBackend,
    seg: SegmentId,
}

impl RealPath {
    async fn new(model: Arc<Model>, layers: Layers, pages: usize) -> Self {
        let layout = model.kv_layout(DEFAULT_PAGE_SIZE);
        let pool = |pages| {
            let mut cfg = PoolConfig::with_pages(layout, pages);
            cfg.defenses = layers.pool;
            Arc::new(KvPool::new(cfg))
        };
        let (decode, prefill) = (pool(pages), pool(pages));
        let backend = MemoryBackend::new(EngineConfig::default());
        let sink: Arc<dyn PageSink> = decode.clone();
        let desc = backend.register_segment(sink).await.expect("register");
        let seg = backend.open_segment(&desc).await.expect("open");
        Self {
            model,
            layers,
            decode,
            prefill,
            backend,
            seg,
        }
    }

    fn admit(&self, pool_tokens: usize, prompt: usize, max_tokens: usize) {
        Admission::new(self.model.context_length(), pool_tokens)
            .check(prompt, max_tokens)
            .expect("admitted");
    }

    /// One greedy request; returns (time to first token, process CPU seconds to the first
    /// token, completion tokens).
    async fn serve(&self, prompt: &[u32], max_tokens: usize) -> (Duration, f64, usize) {
        let (t0, c0) = (Instant::now(), cpu_seconds());
        let n = prompt.len();
        if self.layers.router_rejection {
            let cap = self
                .decode
                .capacity_tokens()
                .min(self.prefill.capacity_tokens());
            self.admit(cap, n, max_tokens);
        }
        if self.layers.worker_admission {
            self.admit(self.decode.capacity_tokens(), n, max_tokens);
        }
        let owner = Owner {
            request: RequestId::random(),
            tenant: TenantId::new("bench"),
        };
        let reserved = self.decode.reserve(owner.clone(), n).expect("reserve");
        let grant = reserved.grant().clone();
        if self.layers.worker_admission {
            self.admit(self.prefill.capacity_tokens(), n, max_tokens);
        }
        let mut seq = self.prefill.allocate(owner, n).expect("prefill pages");
        let logits = self.model.prefill(&mut seq, prompt).expect("prefill");
        let first = argmax(&logits);
        let mut reqs = Vec::with_capacity(grant.pages.len());
        let mut sums = Vec::with_capacity(grant.pages.len());
        for (i, &(page, generation)) in grant.pages.iter().enumerate() {
            let src = seq.page_bytes(i).expect("own page").to_vec();
            sums.push(page_checksum(&src));
            reqs.push(PageWriteReq {
                dst_page: page,
                dst_generation: generation,
                tokens: grant.tokens_in_page(i) as u32,
                src: Bytes::from(src),
            });
        }
        drop(seq);
        let batch = self
            .backend
            .submit_batch(self.seg, grant.key, reqs)
            .expect("submit");
        let status = batch.wait().await;
        assert!(
            matches!(status, BatchStatus::Completed { .. }),
            "{status:?}"
        );
        self.backend
            .drain(self.seg, grant.key)
            .await
            .expect("drain");
        let mut pages = reserved
            .commit(&CommitManifest::new(grant.key, n, sums))
            .expect("commit");
        let (ttft, cpu_ttft) = (t0.elapsed(), cpu_seconds() - c0);
        pages.grow(n + max_tokens).expect("grow");
        let (mut tok, mut made) = (first, 1);
        while made < max_tokens {
            let logits = self
                .model
                .decode_step(&mut [(&mut pages, tok)])
                .pop()
                .expect("one result")
                .expect("decode step");
            tok = argmax(&logits);
            made += 1;
        }
        (ttft, cpu_ttft, made)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand with --release"]
async fn defenses_cost_with_the_real_model() {
    const REQUESTS: usize = 3;
    const PROMPT: usize = 128;
    const MAX_TOKENS: usize = 32;
    let path = pagewarden_system_tests::model_path();
    // One kernel thread: the figures then count work, not waits for a shared machine's cores.
    let opts = LoadOptions {
        threads: 1,
        ..LoadOptions::default()
    };
    let model = Arc::new(Model::load(&path, &opts).expect("load model"));
    let text = "Disaggregated serving splits prefill and decode so that each runs on hardware \
                sized for it; the KV cache moves page by page with a generation tag on each. "
        .repeat(8);
    let ids = model.tokenizer().encode(&text, false);
    assert!(ids.len() >= PROMPT + REQUESTS, "text too short");
    // Distinct prompts: each request starts at its own offset of the text.
    let prompts: Vec<Vec<u32>> = (0..REQUESTS).map(|r| ids[r..r + PROMPT].to_vec()).collect();
    let pages = 2 * (PROMPT + MAX_TOKENS).div_ceil(DEFAULT_PAGE_SIZE);
    compare("real model", "tok/s", |layers| {
        let (model, prompts) = (model.clone(), prompts.clone());
        async move {
            let p = RealPath::new(model, layers, pages).await;
            let (mut ttft, mut cpu_ttft, mut tokens) = (Duration::ZERO, 0.0, 0);
            let (t0, c0) = (Instant::now(), cpu_seconds());
            for prompt in &prompts {
                let (t, c, n) = p.serve(prompt, MAX_TOKENS).await;
                ttft += t;
                cpu_ttft += c;
                tokens += n;
            }
            Round {
                throughput: tokens as f64 / t0.elapsed().as_secs_f64(),
                ttft: ttft / REQUESTS as u32,
                cpu_per_unit: (cpu_seconds() - c0) / tokens as f64,
                cpu_ttft: cpu_ttft / REQUESTS as f64,
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand with --release"]
async fn defenses_cost_on_vs_off() {
    // Enough requests for a round of about a second: shorter rounds measure the scheduler.
    const REQUESTS: usize = 30_000;
    compare("no model", "req/s", |layers| async move {
        let c = Cluster::with_pages(layers, 64, 64).await;
        let mut first = Duration::ZERO;
        let (t0, c0) = (Instant::now(), cpu_seconds());
        for i in 0..REQUESTS {
            let prompt = 16 + (i * 37) % 240;
            let s = Instant::now();
            let r = c.serve(&A, prompt, 16).await.expect("served");
            first += s.elapsed();
            assert!(contains_marker(&r.bytes, A.marker));
        }
        Round {
            throughput: REQUESTS as f64 / t0.elapsed().as_secs_f64(),
            ttft: first / REQUESTS as u32,
            cpu_per_unit: (cpu_seconds() - c0) / REQUESTS as f64,
            // Too short for 10 ms ticks: the wall-clock TTFT is the figure here.
            cpu_ttft: f64::NAN,
        }
    })
    .await;
}
