//! The scheduler in-process: a tiny model, a small pool, commands on its channel.

use std::sync::Arc;
use std::time::Duration;

use pagewarden_common::admission::Admission;
use pagewarden_common::integrity::{IntegritySink, NoopIntegritySink};
use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_common::reject_reason::RejectReason;
use pagewarden_common::shutdown::Shutdown;
use pagewarden_common::{AttemptId, RequestId, TenantId};
use pagewarden_kvcache::{
    page_checksum, CommitManifest, KvPool, Namespace, NamespaceSecret, PageWrite, Placement,
    PoolConfig,
};
use pagewarden_model::{GgufFile, LoadOptions, Model, SamplingParams, Tokenizer};
use pagewarden_proto::v1::{self as pb, TokenEvent};
use pagewarden_worker::{Compute, PrefixCacheLog, QueueRefusal, WorkerError};
use tokio::sync::{mpsc, oneshot};

use super::{run, Command, SchedulerDeps};
use crate::state::{GenerateArgs, Granted};

const PAGE: usize = 16;

/// A scheduler over a pool of `pages` pages; its command channel.
fn scheduler(pages: usize) -> mpsc::Sender<Command> {
    scheduler_with(pages, 16, Duration::from_secs(600)).0
}

/// [`scheduler`] with its queue's bounds; the pool too.
fn scheduler_with(
    pages: usize,
    max_queue: usize,
    queue_timeout: Duration,
) -> (mpsc::Sender<Command>, KvPool) {
    let deps = deps(pages, max_queue, queue_timeout);
    let pool = deps.pool.clone();
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(run(deps, rx, Shutdown::new(), Shutdown::new()));
    (tx, pool)
}

/// A scheduler's parts over a tiny model and a pool of `pages` pages.
fn deps(pages: usize, max_queue: usize, queue_timeout: Duration) -> SchedulerDeps {
    let file = GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(7)).unwrap();
    let model = Arc::new(Model::from_gguf(file, &LoadOptions::default()).unwrap());
    let tokenizer = Arc::new(Tokenizer::from_gguf(model.gguf()).unwrap());
    let mut cfg = PoolConfig::with_pages(model.kv_layout(PAGE), pages);
    cfg.revocation_drains = true;
    // Only a request with a namespace caches (none of the queue tests has one).
    cfg.prefix_pages_per_namespace = pages;
    let pool = KvPool::new(cfg);
    let metrics = Arc::new(WorkerMetrics::new("decode", "tiny"));
    let integrity: Arc<dyn IntegritySink> = Arc::new(NoopIntegritySink);
    SchedulerDeps {
        prefix_log: PrefixCacheLog::new(
            "decode-test",
            "decode",
            pool.clone(),
            metrics.clone(),
            integrity.clone(),
        ),
        compute: Compute::Cpu(model),
        tokenizer,
        admission: Admission::new(pages * PAGE, pages * PAGE),
        pool,
        metrics,
        integrity,
        node_id: "decode-test".into(),
        max_batch: 8,
        max_queue,
        queue_timeout,
        recompute_chunk: 64,
    }
}

type Reply = oneshot::Receiver<Result<Granted, WorkerError>>;

async fn reserve(tx: &mpsc::Sender<Command>, tenant: &str, prompt_tokens: usize) -> Reply {
    let (reply, rx) = oneshot::channel();
    let sampling = SamplingParams {
        max_tokens: 4,
        ..SamplingParams::default()
    };
    tx.send(Command::Reserve {
        req: RequestId::random(),
        attempt: AttemptId(1),
        tenant: TenantId::new(tenant),
        weight: 1,
        prompt: vec![20; prompt_tokens],
        sampling: Box::new(sampling),
        namespace: None,
        reply,
    })
    .await
    .unwrap();
    rx
}

/// Every command sent before this one has been handled.
async fn handled(tx: &mpsc::Sender<Command>) {
    let (reply, rx) = oneshot::channel();
    tx.send(Command::Load { reply }).await.unwrap();
    rx.await.unwrap();
}

fn granted(rx: &mut Reply) -> bool {
    matches!(rx.try_recv(), Ok(Ok(_)))
}

#[tokio::test]
async fn a_tenant_with_nothing_active_passes_another_tenants_blocked_head() {
    // 12 pages: flood's first request takes 5 (its prompt and first token), its second needs
    // 8 and waits for the first to end; quiet's needs 1.
    let tx = scheduler(12);
    let mut first = reserve(&tx, "flood", 5 * PAGE - 1).await;
    let mut second = reserve(&tx, "flood", 8 * PAGE - 1).await;
    let mut quiet = reserve(&tx, "quiet", PAGE - 1).await;
    handled(&tx).await;
    assert!(granted(&mut first));
    assert!(
        !granted(&mut second),
        "the pool cannot hold both of flood's prompts"
    );
    assert!(
        granted(&mut quiet),
        "quiet's only request waited behind flood's blocked head"
    );
    // A second request of "quiet", which now has one active, waits its turn.
    let mut quiet2 = reserve(&tx, "quiet", PAGE - 1).await;
    handled(&tx).await;
    assert!(
        !granted(&mut quiet2),
        "a tenant with a request active passed the head"
    );
}

/// Admission (I3) answers with the typed rejection, before any page is reserved.
#[tokio::test]
async fn a_request_past_the_context_is_rejected_before_any_page() {
    let (tx, pool) = scheduler_with(4, 16, Duration::from_secs(600));
    let free = pool.stats().free;
    let mut over = reserve(&tx, "t", 4 * PAGE).await;
    handled(&tx).await;
    match over.try_recv() {
        Ok(Err(WorkerError::Rejected(r))) => {
            assert_eq!(r.reason(), RejectReason::ContextLengthExceeded)
        }
        other => panic!("want a rejection, got {other:?}"),
    }
    assert_eq!(pool.stats().free, free, "a rejected request took pages");
}

/// A request that fits waits; past the queue's bound or its deadline it is refused with the
/// queue's reason, and the waiting ones hold no pages.
#[tokio::test(start_paused = true)]
async fn the_queue_refuses_past_its_bound_and_its_deadline() {
    let (tx, pool) = scheduler_with(4, 1, Duration::from_millis(200));
    let mut holder = reserve(&tx, "a", 3 * PAGE - 1).await;
    let mut waiting = reserve(&tx, "b", 2 * PAGE - 1).await;
    let mut over_bound = reserve(&tx, "c", 2 * PAGE - 1).await;
    handled(&tx).await;
    assert!(granted(&mut holder));
    match over_bound.try_recv() {
        Ok(Err(WorkerError::Queue {
            refusal: QueueRefusal::Full { limit: 1 },
            ..
        })) => {}
        other => panic!("want queue_full, got {other:?}"),
    }
    assert!(matches!(
        waiting.try_recv(),
        Err(oneshot::error::TryRecvError::Empty)
    ));
    // The scheduler checks deadlines on its 50 ms tick (the paused clock moves when every
    // task waits).
    tokio::time::sleep(Duration::from_millis(400)).await;
    handled(&tx).await;
    match waiting.try_recv() {
        Ok(Err(WorkerError::Queue {
            refusal: QueueRefusal::Timeout { .. },
            ..
        })) => {}
        other => panic!("want queue_timeout, got {other:?}"),
    }
    assert_eq!(
        pool.stats().reserved,
        3,
        "only the holder's prompt is reserved"
    );
}

/// SIGTERM drains: a queued reservation and a new one are refused as unavailable (the router
/// takes them elsewhere), while the reservation holding pages keeps them; the scheduler stops
/// only once that one has ended.
#[tokio::test(start_paused = true)]
async fn a_draining_decode_finishes_what_it_holds_and_takes_nothing_new() {
    let (tx, rx) = mpsc::channel(64);
    let (drain, stop) = (Shutdown::new(), Shutdown::new());
    let task = tokio::spawn(run(
        deps(4, 16, Duration::from_secs(600)),
        rx,
        drain.clone(),
        stop,
    ));
    let (req, reply) = oneshot::channel();
    let held = RequestId::random();
    tx.send(Command::Reserve {
        req: held,
        attempt: AttemptId(1),
        tenant: TenantId::new("a"),
        weight: 1,
        prompt: vec![20; 3 * PAGE - 1],
        sampling: Box::new(SamplingParams {
            max_tokens: 4,
            ..SamplingParams::default()
        }),
        namespace: None,
        reply: req,
    })
    .await
    .unwrap();
    let mut holder = reply;
    let mut queued = reserve(&tx, "b", 2 * PAGE - 1).await;
    handled(&tx).await;
    assert!(granted(&mut holder));
    drain.cancel();
    handled(&tx).await;
    let unavailable = |r: Result<Result<Granted, WorkerError>, _>| matches!(r, Ok(Err(WorkerError::Unavailable(m))) if m.contains("draining"));
    assert!(
        unavailable(queued.try_recv()),
        "the queued one went elsewhere"
    );
    let mut late = reserve(&tx, "c", 1).await;
    handled(&tx).await;
    assert!(unavailable(late.try_recv()), "a new one went elsewhere");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !task.is_finished(),
        "stopped while a reservation held pages"
    );
    let (done, _) = oneshot::channel();
    tx.send(Command::Abort {
        req: held,
        attempt: AttemptId(1),
        reason: "test".into(),
        reply: done,
    })
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the drained scheduler stops")
        .unwrap();
}

/// Reserves `prompt` as `req` in `namespace`, writes the grant's pages as prefill would
/// (zeros: any KV will do), generates greedily until the sequence ends, and returns its
/// events; with the grant's `prefix_tokens`.
async fn generate(
    tx: &mpsc::Sender<Command>,
    pool: &KvPool,
    req: RequestId,
    namespace: Namespace,
    prompt: &[u32],
) -> (Vec<TokenEvent>, usize) {
    let (reply, granted) = oneshot::channel();
    let sampling = SamplingParams {
        max_tokens: 4,
        temperature: 0.0,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    tx.send(Command::Reserve {
        req,
        attempt: AttemptId(1),
        tenant: TenantId::new("t"),
        weight: 1,
        prompt: prompt.to_vec(),
        sampling: Box::new(sampling),
        namespace: Some(namespace),
        reply,
    })
    .await
    .unwrap();
    let Granted {
        grant,
        prefix_tokens,
    } = granted.await.unwrap().unwrap();
    let data = vec![0u8; pool.layout().page_bytes()];
    let checksum = page_checksum(&data);
    for (i, &(page, generation)) in grant.pages.iter().enumerate() {
        pool.write_page(PageWrite {
            key: grant.key,
            page,
            generation,
            tokens: grant.tokens_in_page(i) as u32,
            data: &data,
            checksum,
        })
        .unwrap();
    }
    let manifest = CommitManifest::new(grant.key, grant.tokens, vec![checksum; grant.pages.len()]);
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (reply, done) = oneshot::channel();
    tx.send(Command::Generate {
        req,
        attempt: AttemptId(1),
        args: GenerateArgs {
            manifest,
            first_token: 40,
            first_logprobs: None,
            tx: events_tx,
            received_at: tokio::time::Instant::now(),
        },
        reply,
    })
    .await
    .unwrap();
    done.await.unwrap().unwrap();
    let mut out = Vec::new();
    while let Some(event) = events.recv().await {
        let event = event.unwrap();
        let last = event.finish != pb::FinishReason::Unspecified as i32;
        out.push(event);
        if last {
            break;
        }
    }
    (out, prefix_tokens)
}

/// The last event of a finished sequence accounts for what it was computed over: every page
/// of its table once, covering the tokens whose KV it wrote, and, when its prompt's pages came
/// from decode's prefix cache, the run it reused with the request that produced it.
#[tokio::test]
async fn the_last_event_accounts_for_every_page_and_names_the_producer_of_a_reused_run() {
    let (tx, pool) = scheduler_with(16, 16, Duration::from_secs(600));
    let namespace = Namespace::derive(
        &NamespaceSecret::from_bytes(&[7; 32]),
        Placement::Private(&TenantId::new("t")),
    );
    // 61 tokens and 4 generated: the KV written covers 64 (the last token sampled is never
    // written), which fills exactly 4 pages; a fifth page would hold nothing.
    let prompt: Vec<u32> = (0..4 * PAGE as u32 - 3).map(|i| 30 + i % 40).collect();
    let first_req = RequestId::random();
    let (first, held) = generate(&tx, &pool, first_req, namespace, &prompt).await;
    assert_eq!(held, 0, "nothing cached yet");
    let (last, rest) = first.split_last().unwrap();
    assert!(
        rest.iter().all(|e| e.account.is_none()),
        "only the last event has one"
    );
    assert_eq!(last.finish, pb::FinishReason::Length as i32);
    let completion = first.iter().filter(|e| !e.marker_only).count();
    assert_eq!(completion, 4);
    let account = last
        .account
        .as_ref()
        .expect("the last event carries its account");
    let written = prompt.len() + completion - 1;
    assert_eq!(account.pages.len(), written.div_ceil(PAGE));
    assert_eq!(account.pages.len(), 4);
    let distinct: std::collections::HashSet<u32> = account.pages.iter().map(|p| p.page).collect();
    assert_eq!(distinct.len(), account.pages.len(), "a page listed twice");
    assert!(account.reused.is_empty(), "nothing came from the cache");
    assert_eq!(account.preemptions, 0);
    // Its three full prompt pages are cached now.
    handled(&tx).await;
    assert_eq!(pool.cached_pages(&namespace), 3);

    let (second, held) = generate(&tx, &pool, RequestId::random(), namespace, &prompt).await;
    assert_eq!(
        held,
        3 * PAGE,
        "the cached prompt pages were held, not sent"
    );
    let again = second.last().unwrap().account.as_ref().unwrap();
    assert_eq!(again.pages.len(), 4);
    let distinct: std::collections::HashSet<u32> = again.pages.iter().map(|p| p.page).collect();
    assert_eq!(distinct.len(), 4, "a page listed twice");
    let [run] = &again.reused[..] else {
        panic!("want one reused run, got {:?}", again.reused);
    };
    assert_eq!(run.tokens as usize, 3 * PAGE);
    assert_eq!(run.producer_request_id, first_req.as_bytes().to_vec());
    assert_eq!(run.namespace, namespace.as_bytes().to_vec());
    // The run is the table's start: the very pages the first sequence wrote its prompt into.
    assert_eq!(run.pages, again.pages[..3]);
    assert_eq!(run.pages, account.pages[..3]);
}
