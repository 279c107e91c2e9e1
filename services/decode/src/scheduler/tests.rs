//! The scheduler in-process: a tiny model, a small pool, commands on its channel.

use std::sync::Arc;
use std::time::Duration;

use pagewarden_common::admission::Admission;
use pagewarden_common::integrity::NoopIntegritySink;
use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_common::shutdown::Shutdown;
use pagewarden_common::{AttemptId, RequestId, TenantId};
use pagewarden_kvcache::{KvPool, PoolConfig, WriteGrant};
use pagewarden_model::{GgufFile, LoadOptions, Model, SamplingParams, Tokenizer};
use pagewarden_worker::{Compute, WorkerError};
use tokio::sync::{mpsc, oneshot};

use super::{run, Command, SchedulerDeps};
use crate::sink::DecodeSink;

const PAGE: usize = 16;

/// A scheduler over a pool of `pages` pages; its command channel.
fn scheduler(pages: usize) -> mpsc::Sender<Command> {
    let file = GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(7)).unwrap();
    let model = Arc::new(Model::from_gguf(file, &LoadOptions::default()).unwrap());
    let tokenizer = Arc::new(Tokenizer::from_gguf(model.gguf()).unwrap());
    let pool = KvPool::new(PoolConfig::with_pages(model.kv_layout(PAGE), pages));
    let deps = SchedulerDeps {
        compute: Compute::Cpu(model),
        tokenizer,
        sink: DecodeSink::new(pool.clone()),
        admission: Admission::new(pages * PAGE, pages * PAGE),
        pool,
        metrics: Arc::new(WorkerMetrics::new("decode", "tiny")),
        integrity: Arc::new(NoopIntegritySink),
        node_id: "decode-test".into(),
        max_batch: 8,
        max_queue: 16,
        queue_timeout: Duration::from_secs(600),
        recompute_chunk: 64,
    };
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(run(deps, rx, Shutdown::new()));
    tx
}

type Reply = oneshot::Receiver<Result<WriteGrant, WorkerError>>;

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
        sampling,
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
