//! I12 with the real prefill binary: the unused rows of a prompt's last page leave prefill's
//! pool zeroed, even when that pool page last held a longer prompt of another tenant. The test
//! plays decode: it grants pages on its own transfer receiver and records what lands.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pagewarden_kvcache::{Generation, GrantKey, KvLayout, PageId};
use pagewarden_model::{GgufFile, LoadOptions, Model};
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::prefill_client::PrefillClient;
use pagewarden_system_tests::driver::{fresh_ref, greedy};
use pagewarden_system_tests::{start_prefill, ModelArg};
use pagewarden_transfer::{MemorySink, PageSink, ReceiverCounters, TcpReceiver};

const SEED: u64 = 3;
const PAGE: usize = 16;

fn tiny_layout() -> KvLayout {
    let f = GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(SEED)).expect("tiny gguf");
    let opts = LoadOptions {
        threads: 1,
        prefill_chunk: 256,
        ..LoadOptions::default()
    };
    Model::from_gguf(f, &opts)
        .expect("tiny model")
        .kv_layout(PAGE)
}

/// Sends `prompt` for `tenant` through prefill into pages `first..` of `sink` under a fresh
/// grant; returns the key.
async fn prefill_into(
    client: &mut PrefillClient<tonic::transport::Channel>,
    sink: &MemorySink,
    transfer_addr: &str,
    tenant: &str,
    prompt: &[u32],
    first: u32,
) -> GrantKey {
    let key: [u8; 16] = rand::random();
    let pages: Vec<(PageId, Generation)> = (0..prompt.len().div_ceil(PAGE) as u32)
        .map(|i| (PageId(first + i), Generation(1)))
        .collect();
    sink.grant(GrantKey(key), pages.clone());
    let expires = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(60);
    let grant = pb::WriteGrant {
        key: key.to_vec(),
        tenant: tenant.into(),
        pages: pages
            .iter()
            .map(|(p, g)| pb::GrantPage {
                page: p.0,
                generation: g.0,
            })
            .collect(),
        tokens: prompt.len() as u32,
        page_size: PAGE as u32,
        expires_unix_ms: expires.as_millis() as u64,
        transfer_addr: transfer_addr.into(),
        ..Default::default()
    };
    client
        .prefill(pb::PrefillRequest {
            req: Some(fresh_ref()),
            tenant: tenant.into(),
            prompt_tokens: prompt.to_vec(),
            grant: Some(grant),
            sampling: Some(greedy(1)),
            tenant_weight: 1,
            namespace: Vec::new(),
        })
        .await
        .expect("prefill");
    GrantKey(key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_page_unused_rows_leave_prefill_zeroed() {
    let layout = tiny_layout();
    // Three pages in prefill's pool: the second prompt's pages are among the first's.
    let prefill = start_prefill(
        &ModelArg::Tiny(SEED),
        &["--pool-tokens", "48", "--context-length", "48"],
    );
    let sink = Arc::new(MemorySink::new(16, layout.page_bytes()));
    let receiver = TcpReceiver::bind(
        "127.0.0.1:0".parse().unwrap(),
        sink.clone() as Arc<dyn PageSink>,
        Arc::new(ReceiverCounters::default()),
    )
    .await
    .expect("transfer receiver");
    let addr = receiver.local_addr().to_string();
    let mut client = PrefillClient::connect(prefill.grpc_url())
        .await
        .expect("connect prefill");

    // Tenant A: 40 tokens, three pages, every pool page now holds A's rows.
    let long: Vec<u32> = (0..40).map(|i| 5 + (i * 7) % 50).collect();
    prefill_into(&mut client, &sink, &addr, "tenant-a", &long, 0).await;
    // Tenant B: 20 tokens, two pages; its last page holds 4 rows of B.
    let short: Vec<u32> = (0..20).map(|i| 9 + (i * 3) % 40).collect();
    prefill_into(&mut client, &sink, &addr, "tenant-b", &short, 8).await;

    let (_, first, _) = sink.page(PageId(8)).expect("B's first page landed");
    assert!(first.iter().any(|&b| b != 0), "B's full page carries KV");
    let (_, last, tokens) = sink.page(PageId(9)).expect("B's last page landed");
    assert_eq!(tokens, 4);
    let row = layout.token_width() * 2;
    for layer in 0..layout.layers {
        for kind in 0..2 {
            let block = layout.block_offset(layer, kind) * 2;
            let written = &last[block..block + 4 * row];
            let unused = &last[block + 4 * row..block + PAGE * row];
            assert!(written.iter().any(|&b| b != 0), "B's rows are there");
            assert!(
                unused.iter().all(|&b| b == 0),
                "layer {layer} {}: rows 4..16 of B's last page carry stale bytes",
                ["K", "V"][kind]
            );
        }
    }
}
