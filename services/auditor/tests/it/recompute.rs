//! The recompute audit on the tiny test model: served logprobs that are the model's own (as a
//! generation computed them) match; the same tokens with one logprob moved past the tolerance
//! open a `recompute_mismatch` incident naming that position; tokens the model cannot hold are
//! a `failed` verdict, not an incident; malformed reports are refused;
//! an auditor without a recompute model counts what it is sent as dropped.

use std::sync::Arc;

use pagewarden_auditor::recompute::RecomputeSettings;
use pagewarden_auditor::Running;
use pagewarden_kvcache::{KvPool, PoolConfig};
use pagewarden_model::{tiny_llama_gguf, Engine, LoadOptions, Model, SamplingParams};
use pagewarden_proto::v1 as pb;
use pagewarden_testkit::poll_until;
use serde_json::Value;

use crate::auth;
use crate::ingest::{get_json, get_text, grpc, start, wait_open_incident};

const SEED: u64 = 5;

/// A generation on the tiny model, as serving computes it: prompt, output, each output token's
/// raw logprob.
pub fn served(prompt: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let file = pagewarden_model::GgufFile::from_bytes(tiny_llama_gguf(SEED)).unwrap();
    let model = Arc::new(Model::from_gguf(file, &LoadOptions::default()).unwrap());
    let pool = KvPool::new(PoolConfig::with_pages(model.kv_layout(16), 64));
    let params = SamplingParams {
        logprobs: Some(0),
        ..SamplingParams::greedy(12)
    };
    let out = Engine::new(model, pool).generate(prompt, &params).unwrap();
    let lp = out.logprobs.iter().map(|l| l.chosen.logprob).collect();
    (out.tokens, lp)
}

pub fn report(prompt: &[u32], output: &[u32], served: &[f32], req: u8) -> pb::RecomputeReport {
    pb::RecomputeReport {
        tenant: "bob".into(),
        req: Some(pb::RequestRef {
            request_id: vec![req; 16],
            attempt: 1,
        }),
        prompt_tokens: prompt.to_vec(),
        output_tokens: output.to_vec(),
        served_logprobs: served.to_vec(),
        temperature: 0.0,
        decode_node: "decode-0".into(),
        pages: vec![pb::GrantPage {
            page: 3,
            generation: 7,
        }],
        ..Default::default()
    }
}

/// `cfg` with the recompute audit on the tiny model (written into `dir`), tolerance 0.5.
pub fn with_model(
    mut cfg: pagewarden_auditor::Config,
    dir: &std::path::Path,
) -> pagewarden_auditor::Config {
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, tiny_llama_gguf(SEED)).unwrap();
    cfg.recompute = Some(RecomputeSettings {
        model: path,
        tolerance: 0.5,
    });
    cfg
}

async fn start_with_model(dir: &std::path::Path) -> Running {
    let cfg = with_model(auth::config("sqlite::memory:"), dir);
    pagewarden_auditor::start(&cfg, None)
        .await
        .expect("auditor starts")
}

async fn recomputes(r: &Running) -> Vec<Value> {
    let v = get_json(format!("http://{}/api/recomputes", r.http_addr)).await;
    v.as_array().expect("a list").clone()
}

#[tokio::test]
async fn served_logprobs_match_and_a_moved_one_is_a_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let r = start_with_model(dir.path()).await;
    let mut g = grpc(&r).await;
    let prompt: Vec<u32> = (0..20).map(|i| 10 + (i * 7) % 50).collect();
    let (output, lp) = served(&prompt);
    assert!(output.len() > 4, "{output:?}");

    g.report_recompute(report(&prompt, &output, &lp, 1))
        .await
        .unwrap();
    let mut moved = lp.clone();
    moved[3] -= 0.75;
    g.report_recompute(report(&prompt, &output, &moved, 2))
        .await
        .unwrap();
    // Tokens the model cannot hold (out of its vocabulary): recorded as failed, no incident.
    g.report_recompute(report(&prompt, &[1 << 30], &[-1.0], 3))
        .await
        .unwrap();
    let rows = poll_until(std::time::Duration::from_secs(30), || async {
        let rows = recomputes(&r).await;
        (rows.len() == 3).then_some(rows)
    })
    .await
    .expect("all three recomputed");
    assert_eq!(rows[0]["verdict"], "failed", "{rows:?}");
    let rows = &rows[1..];
    // Newest first: the moved one, then the served one.
    assert_eq!(rows[1]["verdict"], "match", "{rows:?}");
    assert_eq!(rows[1]["max_diff_micro"], 0, "{rows:?}");
    assert_eq!(rows[0]["verdict"], "mismatch", "{rows:?}");
    assert_eq!(rows[0]["first_divergence"], 3, "{rows:?}");
    assert_eq!(rows[0]["tolerance_micro"], 500_000);
    let (inc, _) = wait_open_incident(&r, "recompute_mismatch").await;
    assert_eq!(inc["tenant"], "bob");
    assert_eq!(inc["request_id"], "02".repeat(16));
    let details: Value = serde_json::from_str(inc["details"].as_str().unwrap()).unwrap();
    assert_eq!(details["first_divergence"], 3);
    assert_eq!(details["pages"][0]["generation"], 7);
    let metrics = get_text(format!("http://{}/metrics", r.http_addr)).await;
    for line in [
        "pagewarden_auditor_recomputes_total{verdict=\"match\"} 1",
        "pagewarden_auditor_recomputes_total{verdict=\"mismatch\"} 1",
        "pagewarden_auditor_recomputes_total{verdict=\"failed\"} 1",
        "pagewarden_auditor_incidents_opened_total{kind=\"recompute_mismatch\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    }
    r.shutdown().await;
}

#[tokio::test]
async fn malformed_reports_are_refused_and_without_a_model_they_are_dropped() {
    let r = start().await;
    let mut g = grpc(&r).await;
    let ok = report(&[1, 2, 3], &[4, 5], &[-0.5, -1.0], 9);
    let bad = [
        pb::RecomputeReport {
            served_logprobs: vec![-0.5],
            ..ok.clone()
        },
        pb::RecomputeReport {
            prompt_tokens: vec![],
            ..ok.clone()
        },
        pb::RecomputeReport {
            served_logprobs: vec![-0.5, 0.25],
            ..ok.clone()
        },
        pb::RecomputeReport {
            served_logprobs: vec![-0.5, f32::NAN],
            ..ok.clone()
        },
        pb::RecomputeReport {
            tenant: String::new(),
            ..ok.clone()
        },
    ];
    for b in bad {
        let e = g.report_recompute(b.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{b:?}: {e}");
    }
    g.report_recompute(ok).await.unwrap();
    let metrics = get_text(format!("http://{}/metrics", r.http_addr)).await;
    assert!(
        metrics.contains("pagewarden_auditor_recompute_dropped_total 1"),
        "{metrics}"
    );
    assert!(recomputes(&r).await.is_empty());
    r.shutdown().await;
}
