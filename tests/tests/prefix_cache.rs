//! The prefix cache through the real suite (real binaries, the real model): a tenant repeating
//! a 2,000-token prompt prefix hits its cache (the response's
//! `usage.prompt_tokens_details.cached_tokens` and prefill's metrics say so, and only the suffix
//! is computed), decode already holds the prefix (its metrics say so, and prefill sends it only
//! the suffix's pages), and the greedy tokens equal the uncached run's; another tenant sending
//! the very same prompt hits nothing on either worker and is sent every page. The auditor
//! holds each worker's hits and misses per tenant. The two halves are one test: "no hit for
//! the other tenant" alone would also pass with the cache off.

use std::time::Duration;

use pagewarden_system_tests::{
    api_key, get_json, start_auditor, start_decode, start_prefill, start_router, ModelArg, Service,
};
use pagewarden_testkit::eventually;
use serde_json::{json, Value};

/// A long, deterministic shared prefix (a system prompt or a document), then a question.
fn prompt(question: &str) -> String {
    let (colors, animals, places) = (
        ["red", "green", "blue", "amber", "violet"],
        ["fox", "heron", "otter", "lynx", "badger", "crane", "hare"],
        ["river", "market", "harbour", "orchard", "quarry", "library"],
    );
    let mut p = String::from("Read the log below, then answer the question.\n\n");
    for i in 0..170 {
        p.push_str(&format!(
            "Entry {i}: the {} {} walked to the {} at {} o'clock.\n",
            colors[i % colors.len()],
            animals[i % animals.len()],
            places[i % places.len()],
            i % 12 + 1,
        ));
    }
    p.push_str(&format!("\nQuestion: {question}\nAnswer:"));
    p
}

struct Answer {
    text: String,
    prompt_tokens: u64,
    completion_tokens: u64,
    cached_tokens: u64,
}

async fn complete(http: &reqwest::Client, router: &str, tenant: usize, prompt: &str) -> Answer {
    let r = http
        .post(format!("{router}/v1/completions"))
        .bearer_auth(api_key(tenant))
        .json(&json!({"model": "m", "prompt": prompt, "max_tokens": 24, "temperature": 0}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json body");
    let usage = &v["usage"];
    Answer {
        text: v["choices"][0]["text"].as_str().expect("text").to_string(),
        prompt_tokens: usage["prompt_tokens"].as_u64().expect("prompt_tokens"),
        completion_tokens: usage["completion_tokens"]
            .as_u64()
            .expect("completion_tokens"),
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("usage.prompt_tokens_details.cached_tokens"),
    }
}

/// The value of the counter `name`, summed over its series (0 when absent).
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of a worker's counter `name` for `tenant` (0 when the series is absent).
fn tenant_counter(metrics: &str, name: &str, tenant: &str) -> f64 {
    let label = format!("tenant=\"{tenant}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The auditor's `(hits, misses, cached tokens)` for `tenant` on workers of `role`, once it
/// has `events` of them (reports are buffered and sent in the background).
async fn audited(auditor: &Service, role: &str, tenant: &str, events: u64) -> (u64, u64, u64) {
    let what = format!("{events} {role} events for {tenant} at the auditor");
    eventually(Duration::from_secs(20), &what, || async {
        let totals = get_json(auditor, "/api/cache").await;
        let row = totals
            .as_array()
            .expect("a list")
            .iter()
            .find(|t| t["role"] == role && t["tenant"] == tenant)
            .map(|t| {
                let n = |k: &str| t[k].as_u64().expect("a count");
                (n("hits"), n("misses"), n("cached_tokens"))
            });
        match row {
            Some(r) if r.0 + r.1 >= events => Ok(r),
            _ => Err(totals),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reuses_its_cached_prefix_and_another_tenant_never_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = start_auditor(dir.path());
    let grpc = auditor.grpc_url();
    let decode = start_decode(&ModelArg::Real, &["--auditor", &grpc]);
    let prefill = start_prefill(&ModelArg::Real, &["--auditor", &grpc]);
    let router = start_router(&ModelArg::Real, &[&decode], &[&prefill]).await;
    let (http, url) = (reqwest::Client::new(), router.http_url());
    let p = prompt("Which animal walked to the orchard at 4 o'clock?");

    let sent = "pagewarden_transfer_bytes_total";
    let cold = complete(&http, &url, 0, &p).await;
    let cold_bytes = counter(&prefill.metrics().await, sent);
    assert!(
        cold.prompt_tokens >= 2000,
        "{} prompt tokens",
        cold.prompt_tokens
    );
    assert_eq!(
        cold.cached_tokens, 0,
        "nothing was cached before the first request"
    );

    let warm = complete(&http, &url, 0, &p).await;
    let warm_bytes = counter(&prefill.metrics().await, sent) - cold_bytes;
    // Every full page but the one holding the last token (its logits give the first token).
    let page = 16;
    assert!(
        warm.cached_tokens >= cold.prompt_tokens - 2 * page,
        "the same tenant's repeat reused only {} of {} prompt tokens",
        warm.cached_tokens,
        cold.prompt_tokens
    );
    assert_eq!(
        (warm.text.as_str(), warm.completion_tokens),
        (cold.text.as_str(), cold.completion_tokens),
        "greedy output over the cached prefix differs from the uncached run"
    );

    let other = complete(&http, &url, 1, &p).await;
    let other_bytes = counter(&prefill.metrics().await, sent) - cold_bytes - warm_bytes;
    assert_eq!(
        other.cached_tokens, 0,
        "tenant-1 hit the prefix only tenant-0 sent"
    );
    assert_eq!(
        other.text, cold.text,
        "the same prompt, computed cold again"
    );

    // Prefill's own account: tenant-0's hits are the warm request's; tenant-1 has none.
    let m = prefill.metrics().await;
    let hits = "pagewarden_prefix_cache_hit_tokens_total";
    assert_eq!(
        tenant_counter(&m, hits, "tenant-0"),
        warm.cached_tokens as f64
    );
    assert_eq!(tenant_counter(&m, hits, "tenant-1"), 0.0);
    let queried = "pagewarden_prefix_cache_queried_tokens_total";
    assert_eq!(
        tenant_counter(&m, queried, "tenant-1"),
        other.prompt_tokens as f64
    );
    assert!(
        tenant_counter(&m, "pagewarden_prefix_cache_pages", "tenant-1") > 0.0,
        "tenant-1's own pages were cached under its own namespace"
    );

    // Decode's account: it held tenant-0's prefix (the same whole pages prefill reused), so
    // prefill sent it only the last page; tenant-1 got no hit there either, and every page.
    let d = decode.metrics().await;
    assert_eq!(
        tenant_counter(&d, hits, "tenant-0"),
        warm.cached_tokens as f64,
        "decode did not hold tenant-0's prefix"
    );
    assert_eq!(
        tenant_counter(&d, hits, "tenant-1"),
        0.0,
        "decode granted tenant-1 after a prefix only tenant-0 sent"
    );
    assert!(
        cold_bytes > 0.0 && warm_bytes * 10.0 < cold_bytes,
        "the warm request still sent {warm_bytes} bytes of KV (cold: {cold_bytes})"
    );
    assert_eq!(
        other_bytes, cold_bytes,
        "tenant-1's request must be sent every page, as the cold one was"
    );

    // The auditor's account, per worker and tenant: tenant-0 missed once and hit once (as
    // much as it was served from the cache), tenant-1 only missed.
    for role in ["prefill", "decode"] {
        assert_eq!(
            audited(&auditor, role, "tenant-0", 2).await,
            (1, 1, warm.cached_tokens),
            "{role}'s events for tenant-0"
        );
        assert_eq!(
            audited(&auditor, role, "tenant-1", 1).await,
            (0, 1, 0),
            "{role}'s events for tenant-1"
        );
    }
    // And the pages each tenant's namespace holds on prefill now, as prefill last said: what
    // its own gauge says.
    let on_prefill = |tenant: &str| tenant_counter(&m, "pagewarden_prefix_cache_pages", tenant);
    for tenant in ["tenant-0", "tenant-1"] {
        let want = on_prefill(tenant);
        assert!(want > 0.0, "{tenant} holds no pages on prefill");
        let what = format!("{tenant}'s {want} pages held on prefill at the auditor");
        eventually(Duration::from_secs(20), &what, || async {
            let totals = get_json(&auditor, "/api/cache").await;
            let held = totals.as_array().expect("a list").iter().find_map(|t| {
                (t["role"] == "prefill" && t["tenant"] == tenant)
                    .then(|| t["pages_held"].as_f64())
                    .flatten()
            });
            match held {
                Some(h) if h == want => Ok(()),
                _ => Err(totals),
            }
        })
        .await;
    }
}

/// `n` choices share their prompt's pages only inside the tenant's namespace: a tenant's four
/// choices compute the prompt once (the later three hit the first one's pages), and another
/// tenant asking the very same with `n = 4` hits nothing of the first tenant's: its first
/// choice is computed cold, its own later choices hit only its own pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_share_pages_within_a_tenant_and_never_across() {
    let decode = start_decode(&ModelArg::Real, &[]);
    let prefill = start_prefill(&ModelArg::Real, &[]);
    let router = start_router(&ModelArg::Real, &[&decode], &[&prefill]).await;
    let (http, url) = (reqwest::Client::new(), router.http_url());
    let mut p = String::from("Count the birds in this list.\n");
    for i in 0..40 {
        p.push_str(&format!("Line {i}: a heron and {} sparrows.\n", i % 7));
    }
    let ask = |tenant: usize| {
        let (http, url, p) = (http.clone(), url.clone(), p.clone());
        async move {
            let r = http
                .post(format!("{url}/v1/completions"))
                .bearer_auth(api_key(tenant))
                .json(&json!({"model": "m", "prompt": p, "max_tokens": 8, "n": 4, "seed": 3}))
                .send()
                .await
                .expect("request");
            assert_eq!(r.status(), 200);
            let v: Value = r.json().await.expect("json body");
            assert_eq!(v["choices"].as_array().map(Vec::len), Some(4), "{v}");
            v
        }
    };
    let hits = "pagewarden_prefix_cache_hit_tokens_total";
    let first = ask(2).await;
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().expect("usage") as f64;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let page = 16.0;
    let own = tenant_counter(&prefill.metrics().await, hits, "tenant-2");
    assert!(
        own >= 3.0 * (prompt_tokens - 2.0 * page),
        "tenant-2's later choices reused only {own} tokens of a {prompt_tokens}-token prompt"
    );

    let other = ask(3).await;
    assert_eq!(
        other["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "tenant-3's first choice hit tenant-2's pages: {other}"
    );
    for (worker, m) in [
        ("prefill", prefill.metrics().await),
        ("decode", decode.metrics().await),
    ] {
        assert_eq!(
            tenant_counter(&m, hits, "tenant-3"),
            tenant_counter(&m, hits, "tenant-2"),
            "{worker}: tenant-3's choices should hit their own pages exactly as tenant-2's did"
        );
    }
}
