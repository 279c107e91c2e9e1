//! `DELETE /v1/cache` through the real suite (real binaries, the real model): a tenant whose
//! prompt is cached on both workers erases its cache, gets a certificate with each worker's
//! page counts, and its same prompt afterwards is served with 0 cached tokens, while another
//! tenant's cache is untouched (its repeat still hits). Without a key the call is a 401. The
//! auditor logs the erasure: tenant, per-worker counts and the certificate's digest.

use std::time::Duration;

use pagewarden_system_tests::prompts::notes_prompt;
use pagewarden_system_tests::{
    api_key, get_json, start_auditor, start_decode, start_prefill, start_router_with, ModelArg,
};
use pagewarden_testkit::eventually;
use serde_json::{json, Value};

/// A prompt of several whole pages, distinct per `topic`.
fn prompt(topic: &str) -> String {
    notes_prompt(topic, 24)
}

/// The prompt's `cached_tokens` in a completion by tenant `tenant`.
async fn cached_tokens(http: &reqwest::Client, router: &str, tenant: usize, prompt: &str) -> u64 {
    let r = http
        .post(format!("{router}/v1/completions"))
        .bearer_auth(api_key(tenant))
        .json(&json!({"model": "m", "prompt": prompt, "max_tokens": 2, "temperature": 0}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json body");
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage.prompt_tokens_details.cached_tokens in {v}"))
}

async fn erase(http: &reqwest::Client, router: &str, key: Option<&str>) -> (u16, Value) {
    let mut req = http.delete(format!("{router}/v1/cache"));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.expect("DELETE /v1/cache");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_erases_its_own_cache_on_every_worker_and_no_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = start_auditor(dir.path());
    let grpc = auditor.grpc_url();
    let decode = start_decode(&ModelArg::Real, &["--auditor", &grpc]);
    let prefill = start_prefill(&ModelArg::Real, &["--auditor", &grpc]);
    let router = start_router_with(
        &ModelArg::Real,
        &[&decode],
        &[&prefill],
        &["--auditor", &grpc],
    )
    .await;
    let (http, url) = (reqwest::Client::new(), router.http_url());
    let (a, b) = (prompt("rivers"), prompt("mountains"));

    assert_eq!(cached_tokens(&http, &url, 0, &a).await, 0);
    let a_hit = cached_tokens(&http, &url, 0, &a).await;
    assert!(
        a_hit > 0,
        "tenant-0's repeat hit nothing: the cache is off?"
    );
    assert_eq!(cached_tokens(&http, &url, 1, &b).await, 0);
    let b_hit = cached_tokens(&http, &url, 1, &b).await;
    assert!(b_hit > 0, "tenant-1's repeat hit nothing");

    let (status, body) = erase(&http, &url, None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");

    let (status, cert) = erase(&http, &url, Some(&api_key(0))).await;
    assert_eq!(status, 200, "{cert}");
    assert_eq!(cert["object"], "cache.erasure");
    assert_eq!(cert["tenant"], "tenant-0");
    let digest = cert["digest"].as_str().expect("digest").to_string();
    assert_eq!(digest.len(), 64, "{cert}");
    let workers = cert["workers"].as_array().expect("workers");
    let mut roles: Vec<&str> = workers.iter().filter_map(|w| w["role"].as_str()).collect();
    roles.sort_unstable();
    assert_eq!(roles, ["decode", "prefill"], "{cert}");
    for w in workers {
        let n = |k: &str| w[k].as_u64().unwrap_or_else(|| panic!("{k} in {w}"));
        // Both workers cached tenant-0's prompt pages; nothing reads them now.
        assert!(n("entries") > 0, "{w}");
        assert_eq!(n("pages_zeroed") + n("pages_deferred"), n("entries"), "{w}");
        assert_eq!(n("pages_deferred"), 0, "{w}");
        assert_eq!(w["digest"].as_str().map(str::len), Some(64), "{w}");
    }

    assert_eq!(
        cached_tokens(&http, &url, 0, &a).await,
        0,
        "tenant-0's prompt was still served from the cache after its erasure"
    );
    assert_eq!(
        cached_tokens(&http, &url, 1, &b).await,
        b_hit,
        "tenant-0's erasure touched tenant-1's cache"
    );

    // The auditor's log: the erasure, its counts and digest (reports are sent in the background).
    let logged = eventually(
        Duration::from_secs(20),
        "the erasure at the auditor",
        || async {
            let rows = get_json(&auditor, "/api/erasures").await;
            let row = rows
                .as_array()
                .and_then(|r| r.iter().find(|e| e["digest"] == digest.as_str()))
                .cloned();
            row.ok_or(rows)
        },
    )
    .await;
    assert_eq!(logged["tenant"], "tenant-0", "{logged}");
    let logged_workers = logged["workers"].as_array().expect("workers");
    assert_eq!(logged_workers.len(), 2, "{logged}");
    let entries = |ws: &[Value]| ws.iter().filter_map(|w| w["entries"].as_u64()).sum::<u64>();
    assert_eq!(entries(logged_workers), entries(workers), "{logged}");
    assert!(!logged.to_string().contains("Notes about"), "{logged}");
}
