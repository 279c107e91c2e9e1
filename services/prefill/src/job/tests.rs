//! One prefill job in-process: a tiny model, a prefill pool with its prefix cache on, and a
//! decode pool behind a loopback TCP receiver that takes the grant's pages.

use std::sync::Arc;
use std::time::Duration;

use pagewarden_common::integrity::{IntegritySink, NoopIntegritySink};
use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_common::{AttemptId, RequestId, TenantId};
use pagewarden_kvcache::{
    KvPool, Namespace, NamespaceSecret, Owner, Placement, PoolConfig, ReservedPages,
};
use pagewarden_model::{GgufFile, LoadOptions, Model, SamplingParams};
use pagewarden_proto::v1 as pb;
use pagewarden_transfer::{EngineConfig, ReceiverCounters, TcpBackend, TcpReceiver};
use pagewarden_worker::{Compute, PrefixCacheLog};
use tokio_util::sync::CancellationToken;

use super::{passes, run, JobDeps};
use crate::gate::{Gate, GateConfig};
use crate::grant::{ReceivedGrant, ValidPrefill};
use crate::segments::Segments;
use crate::turns::Turns;

const PAGE: usize = 16;

/// A decode pool and its loopback receiver (kept alive while the test runs).
struct Decode {
    pool: KvPool,
    receiver: TcpReceiver,
}

fn model() -> Arc<Model> {
    let file = GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(7)).unwrap();
    Arc::new(Model::from_gguf(file, &LoadOptions::default()).unwrap())
}

async fn decode(model: &Model) -> Decode {
    let pool = KvPool::new(PoolConfig::with_pages(model.kv_layout(PAGE), 32));
    let receiver = TcpReceiver::bind(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(pool.clone()),
        Arc::new(ReceiverCounters::default()),
    )
    .await
    .unwrap();
    Decode { pool, receiver }
}

/// A prefill worker's job dependencies over `model`, its prefix cache on.
fn deps(model: Arc<Model>) -> Arc<JobDeps> {
    deps_chunked(model, 64)
}

/// [`deps`] with `chunk_tokens` prompt tokens a turn.
fn deps_chunked(model: Arc<Model>, chunk_tokens: usize) -> Arc<JobDeps> {
    let mut cfg = PoolConfig::with_pages(model.kv_layout(PAGE), 32);
    cfg.prefix_pages_per_namespace = 32;
    let pool = KvPool::new(cfg);
    let metrics = Arc::new(WorkerMetrics::new("prefill", "tiny"));
    let integrity: Arc<dyn IntegritySink> = Arc::new(NoopIntegritySink);
    Arc::new(JobDeps {
        compute: Compute::Cpu(model.clone()),
        pool: pool.clone(),
        segments: Segments::new(TcpBackend::new(
            EngineConfig::default(),
            "127.0.0.1:0".parse().unwrap(),
        )),
        gate: Gate::new(
            pool.clone(),
            GateConfig {
                max_running: 4,
                max_queue: 16,
                queue_timeout: Duration::from_secs(60),
            },
            metrics.clone(),
        ),
        prefix_log: PrefixCacheLog::new(
            "prefill-test",
            "prefill",
            pool,
            metrics.clone(),
            integrity,
        ),
        metrics,
        chunk_tokens,
        batch_pages: 4,
        turns: Turns::default(),
        model,
    })
}

/// Reserves `prompt` on decode and runs it as request `req` of tenant "t" in `namespace`;
/// the reply, and the reservation (dropped by the caller once the reply is checked).
async fn prefill(
    deps: &Arc<JobDeps>,
    decode: &Decode,
    req: RequestId,
    namespace: Namespace,
    prompt: &[u32],
) -> (pb::PrefillReply, ReservedPages) {
    let tenant = TenantId::new("t");
    let owner = Owner {
        request: req,
        tenant: tenant.clone(),
    };
    let reserved = decode.pool.reserve(owner, prompt.len()).unwrap();
    let g = reserved.grant();
    let grant = ReceivedGrant {
        key: g.key,
        tenant: tenant.as_str().to_string(),
        pages: g.pages.clone(),
        tokens: g.tokens,
        prefix_tokens: 0,
        page_size: g.page_size,
        transfer_addr: decode.receiver.local_addr().to_string(),
        seal: None,
    };
    let job = ValidPrefill {
        req,
        attempt: AttemptId(1),
        tenant,
        weight: 1,
        prompt: prompt.to_vec(),
        grant,
        // Greedy: the cached run must give the first token a computed one gives.
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        namespace: Some(namespace),
    };
    let reply = run(deps.clone(), job, CancellationToken::new())
        .await
        .unwrap();
    (reply, reserved)
}

/// The same prompt twice in one namespace: the first reply reused nothing; the second names
/// the cached pages it attended over as one run of exactly `cached_tokens` tokens, in that
/// namespace, produced by the first request, with the pages the cache holds.
#[tokio::test]
async fn a_repeated_prompt_names_the_first_request_as_producer_of_what_it_reused() {
    let model = model();
    let decode = decode(&model).await;
    let deps = deps(model);
    let namespace = Namespace::derive(
        &NamespaceSecret::from_bytes(&[7; 32]),
        Placement::Private(&TenantId::new("t")),
    );
    let prompt: Vec<u32> = (0..3 * PAGE as u32 + 5).map(|i| 30 + i % 40).collect();
    let (first_req, second_req) = (RequestId::random(), RequestId::random());

    let (first, held) = prefill(&deps, &decode, first_req, namespace, &prompt).await;
    drop(held);
    assert_eq!(first.cached_tokens, 0);
    assert!(first.reused.is_empty(), "nothing came from the cache");

    let (second, held) = prefill(&deps, &decode, second_req, namespace, &prompt).await;
    drop(held);
    assert_eq!(second.cached_tokens as usize, 3 * PAGE);
    assert_eq!(second.first_token, first.first_token);
    let [run] = &second.reused[..] else {
        panic!("want one reused run, got {:?}", second.reused);
    };
    assert_eq!(run.tokens, second.cached_tokens);
    assert_eq!(run.namespace, namespace.as_bytes().to_vec());
    assert_eq!(run.producer_request_id, first_req.as_bytes().to_vec());
    // The pages named are the ones the cache holds for this prompt now.
    let pinned = deps.pool.pin_prefix(&namespace, &prompt);
    let want: Vec<(u32, u64)> = pinned.table().iter().map(|(p, g)| (p.0, g.0)).collect();
    let got: Vec<(u32, u64)> = run.pages.iter().map(|p| (p.page, p.generation)).collect();
    assert_eq!((got.len(), got), (3, want));
}

/// Engine steps counted so far (`vllm:iteration_tokens_total`'s count: one a pass).
fn passes_counted(deps: &JobDeps) -> f64 {
    deps.metrics
        .render()
        .lines()
        .find(|l| l.starts_with("vllm:iteration_tokens_total_count"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// A lone prompt runs its turn's chunk in one pass; while another tenant's job waits for the
/// engine, the turn runs one short pass and ends.
#[tokio::test]
async fn a_lone_chunk_runs_in_one_pass_and_a_waiting_tenant_gets_a_short_one() {
    let deps = deps_chunked(model(), 200);
    let pass = deps.compute.yield_tokens(deps.chunk_tokens);
    assert!(pass < 200, "a short pass is shorter than the chunk");
    let prompt: Vec<u32> = (0..200u32).map(|i| 3 + i % 40).collect();
    let (t, u) = (TenantId::new("t"), TenantId::new("u"));
    let owner = |r| Owner {
        request: RequestId([r; 16]),
        tenant: t.clone(),
    };

    let mut pages = deps.pool.allocate(owner(1), prompt.len()).unwrap();
    let (ran, result) = passes(&deps, &t, None, &mut pages, &prompt, 200, pass, None);
    assert_eq!(ran, 200);
    assert_eq!(
        result.unwrap().0.len(),
        deps.model.config().vocab,
        "the last logits"
    );
    assert_eq!(passes_counted(&deps), 1.0, "one pass for the lone chunk");

    // `t` holds the turn and `u` waits for it.
    let turn = deps.turns.take(&t, 1).await;
    let waiter = tokio::spawn({
        let deps = deps.clone();
        async move {
            drop(deps.turns.take(&u, 1).await);
        }
    });
    while !deps.turns.contended(&t) {
        tokio::task::yield_now().await;
    }
    let mut pages = deps.pool.allocate(owner(2), prompt.len()).unwrap();
    let (ran, result) = passes(&deps, &t, None, &mut pages, &prompt, 200, pass, None);
    assert_eq!(ran, pass, "one short pass, then the turn ends");
    assert!(
        result.unwrap().0.is_empty(),
        "no logits before the prompt's end"
    );
    assert_eq!(passes_counted(&deps), 2.0);
    drop(turn);
    waiter.await.unwrap();
}
