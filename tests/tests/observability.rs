//! What an operator's tools read. Every service's `/metrics` is scraped after real traffic and
//! parsed by a real Prometheus text parser (the Python `prometheus_client` one: its OpenMetrics parser for an
//! `application/openmetrics-text` answer, its 0.0.4 text parser otherwise, chosen by the
//! answer's content type as Prometheus does). vLLM's metric names and labels are checked on the
//! parsed families, so that vLLM's dashboards would find them. A client's W3C `traceparent`
//! is continued by the router: its answer names the same trace.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use pagewarden_system_tests::{
    api_key, start_auditor, start_decode, start_prefill, start_router, worker_args, ModelArg,
    Service,
};
use pagewarden_testkit::eventually;
use serde_json::{json, Value};

const TINY: ModelArg = ModelArg::Tiny(11);

/// Parses exposition text from stdin; prints `[[family, type, sample, labels, value], ...]`.
const PARSER: &str = r#"
import json, sys
text = sys.stdin.read()
if sys.argv[1].startswith("application/openmetrics-text"):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families
out = []
for f in text_string_to_metric_families(text):
    for s in f.samples:
        out.append([f.name, f.type, s.name, s.labels, s.value])
print(json.dumps(out))
"#;

/// One parsed sample.
#[derive(Debug)]
struct Sample {
    family: String,
    kind: String,
    name: String,
    labels: serde_json::Map<String, Value>,
    value: f64,
}

/// One sample as the parser prints it: family, type, sample name, labels, value.
type Row = (String, String, String, serde_json::Map<String, Value>, f64);

/// Scrapes `url` and parses the answer with the real parser; panics on a parse error.
async fn scrape(url: &str) -> Vec<Sample> {
    let r = reqwest::get(url).await.expect("scrape");
    assert!(r.status().is_success(), "{url}: {}", r.status());
    let content_type = r
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("text/plain")
        .to_string();
    let text = r.text().await.expect("metrics body");
    let mut child = Command::new("python3")
        .args(["-c", PARSER, &content_type])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (scripts/test.sh installs prometheus-client)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write metrics text");
    let out = child.wait_with_output().expect("parser");
    assert!(
        out.status.success(),
        "{url} ({content_type}) did not parse:\n{}\n--- text ---\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Row> = serde_json::from_slice(&out.stdout).expect("parser output");
    rows.into_iter()
        .map(|(family, kind, name, labels, value)| Sample {
            family,
            kind,
            name,
            labels,
            value,
        })
        .collect()
}

/// The value of sample `name` whose labels include every pair of `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).and_then(Value::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

fn kind_of<'a>(samples: &'a [Sample], family: &str) -> Option<&'a str> {
    samples
        .iter()
        .find(|s| s.family == family)
        .map(|s| s.kind.as_str())
}

async fn complete(router: &Service, body: Value) -> Value {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(0))
        .json(&body)
        .send()
        .await
        .expect("router request");
    assert_eq!(r.status().as_u16(), 200);
    r.json().await.expect("completion body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_scrapes_and_parses_with_vllm_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = start_auditor(dir.path());
    // The workers report to the auditor, whose prefix-cache counts the dashboard reads.
    let grpc = auditor.grpc_url();
    let decode = start_decode(&TINY, &["--auditor", &grpc]);
    let prefill = start_prefill(&TINY, &["--auditor", &grpc]);
    let router = start_router(&TINY, &[&decode], &[&prefill]).await;

    let a = complete(&router, json!({"prompt": "hello there", "max_tokens": 5})).await;
    let b = complete(
        &router,
        json!({"prompt": "a longer prompt than the first one", "max_tokens": 3}),
    )
    .await;
    let prompt_tokens = a["usage"]["prompt_tokens"].as_f64().unwrap()
        + b["usage"]["prompt_tokens"].as_f64().unwrap();
    let generated = a["usage"]["completion_tokens"].as_f64().unwrap()
        + b["usage"]["completion_tokens"].as_f64().unwrap();

    // The router: request-level vLLM metrics, labelled with the served model name.
    let r = scrape(&format!("{}/metrics", router.http_url())).await;
    let model = [("model_name", "m")];
    assert_eq!(
        value(&r, "vllm:prompt_tokens_total", &model),
        Some(prompt_tokens),
        "{r:#?}"
    );
    assert_eq!(
        value(&r, "vllm:generation_tokens_total", &model),
        Some(generated)
    );
    let finished: f64 = r
        .iter()
        .filter(|s| s.name == "vllm:request_success_total")
        .map(|s| s.value)
        .sum();
    assert_eq!(finished, 2.0);
    assert_eq!(
        value(&r, "vllm:e2e_request_latency_seconds_count", &model),
        Some(2.0)
    );
    assert_eq!(
        value(&r, "vllm:time_to_first_token_seconds_count", &model),
        Some(2.0)
    );
    assert_eq!(
        kind_of(&r, "vllm:e2e_request_latency_seconds"),
        Some("histogram")
    );
    assert!(value(&r, "vllm:inter_token_latency_seconds_count", &model) >= Some(1.0));
    assert_eq!(
        value(&r, "vllm:request_prompt_tokens_sum", &model),
        Some(prompt_tokens)
    );
    // vLLM's phases of each request: inference is prefill (grant to first token) plus decode
    // (first token to last); time per output token is each gap after the first token.
    let sum_of = |name: &str| value(&r, name, &model).expect(name);
    for phase in ["prefill", "decode", "inference"] {
        let count = format!("vllm:request_{phase}_time_seconds_count");
        assert_eq!(sum_of(&count), 2.0, "{phase}");
    }
    let (prefill_s, decode_s, inference_s) = (
        sum_of("vllm:request_prefill_time_seconds_sum"),
        sum_of("vllm:request_decode_time_seconds_sum"),
        sum_of("vllm:request_inference_time_seconds_sum"),
    );
    assert!(
        (prefill_s + decode_s - inference_s).abs() < 1e-9 && prefill_s > 0.0,
        "prefill {prefill_s} + decode {decode_s} != inference {inference_s}"
    );
    assert_eq!(
        value(&r, "vllm:time_per_output_token_seconds_count", &model),
        value(&r, "vllm:inter_token_latency_seconds_count", &model)
    );
    // One request per prompt, n = 1: the most one choice generated is what each generated.
    assert_eq!(
        value(&r, "vllm:request_max_num_generation_tokens_sum", &model),
        Some(generated)
    );

    // The workers: engine state, labelled with their model and role.
    for (w, engine) in [(&decode, "decode"), (&prefill, "prefill")] {
        let s = scrape(&format!("http://{}/metrics", w.addrs["metrics"])).await;
        let labels = [("engine", engine)];
        assert!(
            value(&s, "vllm:iteration_tokens_total_count", &labels) >= Some(1.0),
            "{engine}: engine steps counted"
        );
        assert_eq!(
            value(&s, "vllm:gpu_cache_usage_perc", &labels),
            value(&s, "vllm:kv_cache_usage_perc", &labels),
            "{engine}: the older name of the same value"
        );
        assert_eq!(
            value(
                &s,
                "vllm:cache_config_info",
                &[("engine", engine), ("block_size", "16")]
            ),
            Some(1.0),
            "{engine}"
        );
        assert_eq!(
            kind_of(&s, "vllm:kv_cache_usage_perc"),
            Some("gauge"),
            "{engine}"
        );
        let usage = value(&s, "vllm:kv_cache_usage_perc", &labels).expect("kv usage");
        assert!((0.0..=1.0).contains(&usage), "{engine}: {usage}");
        assert_eq!(
            value(&s, "vllm:num_requests_waiting", &labels),
            Some(0.0),
            "{engine}"
        );
        assert_eq!(
            value(&s, "vllm:request_queue_time_seconds_count", &labels),
            Some(2.0),
            "{engine}: every request passed its queue once"
        );
        let named = s
            .iter()
            .filter(|x| x.family.starts_with("vllm:"))
            .all(|x| x.labels.get("model_name").and_then(Value::as_str).is_some());
        assert!(named, "{engine}: a vllm:* series without model_name");
        assert!(
            s.iter()
                .any(|x| x.family == "pagewarden_inter_token_latency_seconds"),
            "{engine}: one inter-token name across the suite"
        );
    }

    // n = 2: two finished choices, one request, whose largest choice is what vLLM's
    // request_max_num_generation_tokens observes.
    let before = value(&r, "vllm:request_max_num_generation_tokens_count", &model);
    let c = complete(
        &router,
        json!({"prompt": "two choices", "max_tokens": 3, "n": 2, "temperature": 1.0, "seed": 5}),
    )
    .await;
    let r = scrape(&format!("{}/metrics", router.http_url())).await;
    assert_eq!(
        value(&r, "vllm:request_max_num_generation_tokens_count", &model),
        before.map(|b| b + 1.0),
        "{c}"
    );

    // A refused request, which the dashboard's rejections panel counts.
    let refused = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth("not-a-key")
        .json(&json!({"prompt": "hello", "max_tokens": 1}))
        .send()
        .await
        .expect("router request");
    assert_eq!(refused.status().as_u16(), 401);
    let r = scrape(&format!("{}/metrics", router.http_url())).await;

    // The auditor: its own counters parse too, once the workers' prefix-cache reports are in.
    let auditor_metrics = format!("{}/metrics", auditor.http_url());
    eventually(
        Duration::from_secs(10),
        "the workers' prefix-cache events counted by the auditor",
        || async {
            let text = reqwest::get(&auditor_metrics)
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            text.contains("pagewarden_auditor_prefix_cache_events_total{")
                .then_some(())
        },
    )
    .await;
    let s = scrape(&auditor_metrics).await;
    assert!(
        s.iter().any(|x| x.family.starts_with("pagewarden_")),
        "{s:#?}"
    );

    // Every name vLLM documents (and Pagewarden serves), somewhere in the suite's scrapes.
    let mut scraped = names(&r);
    for w in [&decode, &prefill] {
        scraped.extend(names(
            &scrape(&format!("http://{}/metrics", w.addrs["metrics"])).await,
        ));
    }
    scraped.extend(names(&s));
    let missing: Vec<&str> = VLLM_DOCUMENTED
        .iter()
        .copied()
        .filter(|n| !scraped.contains(*n))
        .collect();
    assert!(missing.is_empty(), "vLLM's names not served: {missing:?}");

    // The shipped dashboard reads only names that exist.
    let exprs = dashboard_queries();
    let mut unknown = Vec::new();
    for expr in &exprs {
        let used = metric_names(expr);
        assert!(!used.is_empty(), "no metric name found in {expr}");
        unknown.extend(used.into_iter().filter(|n| !scraped.contains(n)));
    }
    assert!(
        unknown.is_empty(),
        "the dashboard queries names no service serves: {unknown:?}"
    );
}

/// vLLM's metric names, from its documentation: the list of metrics in "Metrics" (the V1
/// metrics design page, docs.vllm.ai/en/latest/design/v1/metrics.html, section "v0 Metrics")
/// and the V1 names its "Production Metrics" page (docs.vllm.ai/en/stable/usage/metrics/)
/// adds. Left out, as vLLM V1 itself leaves them out: `num_requests_swapped`,
/// `cpu_cache_usage_perc`, `gpu_prefix_cache_hit_rate` and `cpu_prefix_cache_hit_rate` (no CPU
/// swap or offload; hit rates became the two counters below), and `lora_requests_info` (no
/// LoRA). Samples as a scrape names them: counters with `_total`, histograms by family name.
const VLLM_DOCUMENTED: &[&str] = &[
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:gpu_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_max_num_generation_tokens",
    "vllm:num_preemptions_total",
    "vllm:cache_config_info",
    "vllm:iteration_tokens_total",
    // V1's names.
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:inter_token_latency_seconds",
];

/// Family and sample names of a scrape.
fn names(samples: &[Sample]) -> std::collections::BTreeSet<String> {
    samples
        .iter()
        .flat_map(|s| [s.family.clone(), s.name.clone()])
        .collect()
}

/// Every PromQL expression of the shipped Grafana dashboard: its panels' targets and its
/// variables' queries.
fn dashboard_queries() -> Vec<String> {
    let path = pagewarden_system_tests::workspace_root()
        .join("deploy/compose/grafana/dashboards/pagewarden-vllm.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let d: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out: Vec<String> = d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    out.extend(
        d["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["definition"].as_str().map(str::to_string)),
    );
    assert!(out.len() > 10, "{out:?}");
    out
}

/// The metric names in a PromQL expression: Pagewarden's all start `vllm:` or `pagewarden_`.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = ["vllm:", "pagewarden_"]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// A worker's `/metrics` off loopback: refused at start without a metrics token; with one,
/// served to scrapes that present it and to no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_metrics_off_loopback_need_a_token() {
    let mut args = worker_args(&TINY, &[]);
    let i = args
        .iter()
        .position(|a| a == "--metrics-addr")
        .expect("metrics flag");
    args[i + 1] = "0.0.0.0:0".into();
    let err = match Service::try_start("pagewarden-decode", &args) {
        Ok(_) => panic!("decode served /metrics on 0.0.0.0 without a token"),
        Err(e) => e,
    };
    assert!(err.contains("--metrics-token"), "{err}");

    let token = "metrics-token-0123456789";
    args.extend(["--metrics-token".to_string(), token.to_string()]);
    let decode = Service::start("pagewarden-decode", &args);
    let port = decode.addrs["metrics"]
        .rsplit(':')
        .next()
        .expect("a port")
        .to_string();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let client = reqwest::Client::new();
    let status = |r: reqwest::Response| r.status().as_u16();
    let bare = client.get(&url).send().await.expect("scrape");
    assert_eq!(status(bare), 401);
    let wrong = client.get(&url).bearer_auth("not-the-token-at-all").send();
    assert_eq!(status(wrong.await.expect("scrape")), 401);
    let right = client
        .get(&url)
        .bearer_auth(token)
        .send()
        .await
        .expect("scrape");
    assert_eq!(right.status().as_u16(), 200);
    let text = right.text().await.expect("body");
    assert!(text.contains("vllm:kv_cache_usage_perc"), "{text}");
    let live = client
        .get(format!("http://127.0.0.1:{port}/live"))
        .send()
        .await
        .expect("live");
    assert_eq!(status(live), 200, "probes need no token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_traceparent_is_continued() {
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    let router = start_router(&TINY, &[&decode], &[&prefill]).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(0))
        .header("traceparent", format!("00-{trace}-{parent}-01"))
        .json(&json!({"prompt": "hello there", "max_tokens": 2}))
        .send()
        .await
        .expect("router request");
    assert_eq!(r.status().as_u16(), 200);
    let answer = r
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .expect("the answer names its trace")
        .to_string();
    let parts: Vec<&str> = answer.split('-').collect();
    assert_eq!(parts.len(), 4, "{answer}");
    assert_eq!(parts[1], trace, "the client's trace is continued: {answer}");
    assert_ne!(
        parts[2], parent,
        "the router's span is a child, not the client's: {answer}"
    );

    // Without a traceparent, each request roots a trace of its own.
    let ids = fresh_trace_ids(&router).await;
    assert_ne!(ids[0], ids[1]);
    assert!(ids.iter().all(|t| t.len() == 32 && t != trace), "{ids:?}");
}

/// The trace ids of two requests sent without a `traceparent` (a 401 is answered too).
async fn fresh_trace_ids(router: &Service) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..2 {
        let r = reqwest::get(format!("{}/v1/models", router.http_url()))
            .await
            .expect("models");
        let tp = r
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .expect("traceparent on every answer")
            .to_string();
        ids.push(tp.split('-').nth(1).unwrap_or_default().to_string());
    }
    ids
}
