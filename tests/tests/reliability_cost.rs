//! Issue 8, what the defenses cost: the same build with every check on beside the test-only
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

/// One round's figures: requests (or tokens) per second and mean time to first token.
#[derive(Clone, Copy, Debug)]
struct Round {
    throughput: f64,
    ttft: Duration,
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
            "{what} pair {i}: on {:.2} {unit} ttft {:.3} ms | off {:.2} {unit} ttft {:.3} ms",
            a.throughput,
            a.ttft.as_secs_f64() * 1e3,
            b.throughput,
            b.ttft.as_secs_f64() * 1e3
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
        "{what}: median per-pair ratio on/off: throughput {:.4}, TTFT {:.4} ({PAIRS} pairs)",
        median(&mut tput_ratio),
        median(&mut ttft_ratio)
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

    /// One greedy request; returns (time to first token, completion tokens).
    async fn serve(&self, prompt: &[u32], max_tokens: usize) -> (Duration, usize) {
        let t0 = Instant::now();
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
        let ttft = t0.elapsed();
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
        (ttft, made)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand with --release"]
async fn defenses_cost_with_the_real_model() {
    const REQUESTS: usize = 4;
    const PROMPT: usize = 128;
    const MAX_TOKENS: usize = 32;
    let path = pagewarden_system_tests::model_path();
    let model = Arc::new(Model::load(&path, &LoadOptions::default()).expect("load model"));
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
            let (mut ttft, mut tokens) = (Duration::ZERO, 0);
            let t0 = Instant::now();
            for prompt in &prompts {
                let (t, n) = p.serve(prompt, MAX_TOKENS).await;
                ttft += t;
                tokens += n;
            }
            Round {
                throughput: tokens as f64 / t0.elapsed().as_secs_f64(),
                ttft: ttft / REQUESTS as u32,
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand with --release"]
async fn defenses_cost_on_vs_off() {
    const REQUESTS: usize = 300;
    compare("no model", "req/s", |layers| async move {
        let c = Cluster::with_pages(layers, 64, 64).await;
        let mut first = Duration::ZERO;
        let t0 = Instant::now();
        for i in 0..REQUESTS {
            let prompt = 16 + (i * 37) % 240;
            let s = Instant::now();
            let r = c.serve(&A, prompt, 16, None).await.expect("served");
            first += s.elapsed();
            assert!(contains_marker(&r.bytes, A.marker));
        }
        Round {
            throughput: REQUESTS as f64 / t0.elapsed().as_secs_f64(),
            ttft: first / REQUESTS as u32,
        }
    })
    .await;
}
