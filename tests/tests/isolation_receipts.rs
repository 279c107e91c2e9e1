//! Signed isolation receipts on `pagewarden up` (real binaries, the real model), as a tenant
//! uses them: a request with `X-Pagewarden-Receipt: 1` gets a receipt that names what its
//! answer was computed over, `pagewarden verify-receipt` checks it against the key the auditor
//! serves, and a receipt changed in any one field no longer verifies.
//!
//! Checked on the receipts' content: a repeated prompt's receipt names the cached page runs it
//! reused and, as their producer, the first request (whose own receipt reused nothing); every
//! run is in the tenant's own namespace; decode's page table covers the sequence without a
//! page twice; another tenant's receipt for the same prompt names none of the first tenant's
//! requests and another namespace. A stream carries its receipt in its last chunk. A request
//! without the header gets none; a malformed header is a 400.

use std::collections::HashSet;
use std::process::Command;

use pagewarden_system_tests::bin;
use pagewarden_system_tests::prompts::notes_prompt;
use pagewarden_system_tests::up::Up;
use serde_json::{json, Value};

/// A prompt of several whole pages, distinct per `topic`.
fn prompt(topic: &str) -> String {
    notes_prompt(topic, 20)
}

/// A completion of `prompt` by `key`, asking for a receipt; the whole body.
async fn complete(http: &reqwest::Client, up: &Up, key: &str, prompt: &str) -> Value {
    let r = http
        .post(format!("{}/v1/completions", up.api))
        .bearer_auth(key)
        .header("X-Pagewarden-Receipt", "1")
        .json(&json!({"prompt": prompt, "max_tokens": 8, "temperature": 0}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    r.json().await.expect("json body")
}

/// `pagewarden verify-receipt` on `doc` against the auditor's key: (success, its output).
fn verify(up: &Up, doc: &Value, extra: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("receipt.json");
    std::fs::write(&file, serde_json::to_vec_pretty(doc).unwrap()).expect("write receipt");
    let mut cmd = Command::new(bin("pagewarden"));
    cmd.arg("verify-receipt").arg(&file);
    if extra.is_empty() {
        cmd.args(["--auditor", &up.auditor]);
    } else {
        cmd.args(extra);
    }
    let out = cmd.output().expect("running pagewarden verify-receipt");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Every reused run of `half` ("prefill" or "decode") in a receipt's first choice.
fn runs<'a>(receipt: &'a Value, half: &str) -> Vec<&'a Value> {
    receipt["choices"][0][half]["reused"]
        .as_array()
        .map(|r| r.iter().collect())
        .unwrap_or_default()
}

/// One change made to a signed receipt.
type Change = Box<dyn Fn(&mut Value)>;

fn run_tokens(runs: &[&Value]) -> u64 {
    runs.iter().map(|r| r["tokens"].as_u64().unwrap()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_name_what_an_answer_was_computed_over_and_any_change_breaks_them() {
    let cwd = tempfile::tempdir().expect("tempdir");
    let up = Up::start(cwd.path(), &[]);
    let http = reqwest::Client::new();
    let alice = up.keys["dev-alice"].clone();
    let bob = up.keys["dev-bob"].clone();
    let text = prompt("rivers");

    // The auditor serves the public key, unauthenticated.
    let key: Value = http
        .get(format!("{}/api/receipt-key", up.auditor))
        .send()
        .await
        .expect("GET /api/receipt-key")
        .json()
        .await
        .expect("key json");
    assert_eq!(key["alg"], "ed25519", "{key}");
    let public = key["public_key"].as_str().expect("public_key").to_string();

    let first = complete(&http, &up, &alice, &text).await;
    let second = complete(&http, &up, &alice, &text).await;
    let (r1, r2) = (
        &first["pagewarden_receipt"]["receipt"],
        &second["pagewarden_receipt"]["receipt"],
    );
    assert!(r1.is_object() && r2.is_object(), "no receipt: {first}");
    eprintln!("second receipt: {r2:#}");

    // Both verify with the auditor's key, and with the key given by hand.
    for body in [&first, &second] {
        let (ok, out) = verify(&up, body, &[]);
        assert!(ok, "a fresh receipt did not verify: {out}");
        assert!(out.contains("receipt verified"), "{out}");
    }
    let (ok, out) = verify(&up, &second, &["--public-key", &public]);
    assert!(ok, "{out}");

    // What they say: the tenant, its namespace, the response.
    for (body, r) in [(&first, r1), (&second, r2)] {
        assert_eq!(r["tenant"], "dev-alice");
        assert_eq!(r["response_id"], body["id"]);
        assert_eq!(
            r["choices"][0]["prompt"]["tokens"],
            body["usage"]["prompt_tokens"]
        );
        assert_eq!(
            r["choices"][0]["output"]["tokens"],
            body["usage"]["completion_tokens"]
        );
        assert_eq!(r["choices"][0]["transfer"]["verdict"], "verified", "{r}");
        assert_eq!(r["build"]["router_sha256"].as_str().map(str::len), Some(64));
    }
    assert_eq!(r1["namespace"], r2["namespace"]);

    // The first computed everything; the second reused pages the first produced, in its own
    // namespace, exactly as many tokens as its usage says came from the cache.
    assert!(
        runs(r1, "prefill").is_empty() && runs(r1, "decode").is_empty(),
        "{r1}"
    );
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens");
    assert!(cached > 0, "the repeat hit no cache: {second}");
    let prefill_runs = runs(r2, "prefill");
    assert_eq!(run_tokens(&prefill_runs), cached, "{r2}");
    let decode_runs = runs(r2, "decode");
    assert_eq!(
        run_tokens(&decode_runs),
        r2["choices"][0]["decode"]["prefix_tokens"]
            .as_u64()
            .unwrap(),
        "{r2}"
    );
    let first_id = r1["choices"][0]["request_id"].as_str().unwrap();
    for run in prefill_runs.iter().chain(&decode_runs) {
        assert_eq!(run["producer_request_id"], first_id, "{run}");
        assert_eq!(run["namespace"], r2["namespace"], "{run}");
    }

    // Decode's page table: the whole sequence, no page twice, every generation named.
    let pages = r2["choices"][0]["decode"]["pages"]
        .as_array()
        .expect("pages");
    let page_size = r2["choices"][0]["decode"]["page_size"]
        .as_u64()
        .expect("page_size");
    let tokens = r2["choices"][0]["prompt"]["tokens"].as_u64().unwrap()
        + r2["choices"][0]["output"]["tokens"].as_u64().unwrap();
    assert!(
        pages.len() as u64 * page_size >= tokens - 1,
        "{} pages for {tokens} tokens",
        pages.len()
    );
    let distinct: HashSet<u64> = pages.iter().map(|p| p[0].as_u64().unwrap()).collect();
    assert_eq!(distinct.len(), pages.len(), "a page twice: {pages:?}");

    // Any one changed field breaks the signature.
    let tampered: [(&str, Change); 4] = [
        (
            "tenant",
            Box::new(|v| v["receipt"]["tenant"] = json!("dev-bob")),
        ),
        (
            "reused tokens",
            Box::new(|v| v["receipt"]["choices"][0]["prefill"]["cached_tokens"] = json!(0)),
        ),
        (
            "a page's generation",
            Box::new(|v| {
                let g = v["receipt"]["choices"][0]["decode"]["pages"][0][1]
                    .as_u64()
                    .unwrap();
                v["receipt"]["choices"][0]["decode"]["pages"][0][1] = json!(g + 1);
            }),
        ),
        (
            "the output digest",
            Box::new(|v| v["receipt"]["choices"][0]["output"]["sha256"] = json!("00")),
        ),
    ];
    for (what, change) in tampered {
        let mut doc = second["pagewarden_receipt"].clone();
        change(&mut doc);
        let (ok, out) = verify(&up, &doc, &[]);
        assert!(!ok, "a receipt with a changed {what} verified: {out}");
        assert!(out.contains("NOT verified"), "{what}: {out}");
    }

    // Another tenant's receipt for the same prompt: its own namespace, none of Alice's pages.
    let theirs = complete(&http, &up, &bob, &text).await;
    let rb = &theirs["pagewarden_receipt"]["receipt"];
    assert_eq!(rb["tenant"], "dev-bob");
    assert_ne!(rb["namespace"], r1["namespace"]);
    let alice_ids: Vec<&Value> = [r1, r2]
        .iter()
        .map(|r| &r["choices"][0]["request_id"])
        .collect();
    for run in runs(rb, "prefill").iter().chain(&runs(rb, "decode")) {
        assert!(!alice_ids.contains(&&run["producer_request_id"]), "{rb}");
        assert_eq!(run["namespace"], rb["namespace"], "{rb}");
    }
    assert_eq!(theirs["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    // A stream carries its receipt in its last chunk before [DONE].
    let sse = http
        .post(format!("{}/v1/completions", up.api))
        .bearer_auth(&alice)
        .header("X-Pagewarden-Receipt", "1")
        .json(&json!({"prompt": text, "max_tokens": 4, "temperature": 0, "stream": true}))
        .send()
        .await
        .expect("stream")
        .text()
        .await
        .expect("stream body");
    let chunks: Vec<&str> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(chunks.last(), Some(&"[DONE]"), "{sse}");
    let last: Value = serde_json::from_str(chunks[chunks.len() - 2]).expect("last chunk json");
    assert!(last["pagewarden_receipt"].is_object(), "{sse}");
    let (ok, out) = verify(&up, &last, &[]);
    assert!(ok, "a streamed receipt did not verify: {out}");

    // No header, no receipt; a malformed one is a 400.
    let plain: Value = http
        .post(format!("{}/v1/completions", up.api))
        .bearer_auth(&alice)
        .json(&json!({"prompt": "Hi", "max_tokens": 2}))
        .send()
        .await
        .expect("plain")
        .json()
        .await
        .expect("plain json");
    assert!(plain.get("pagewarden_receipt").is_none(), "{plain}");
    let bad = http
        .post(format!("{}/v1/completions", up.api))
        .bearer_auth(&alice)
        .header("X-Pagewarden-Receipt", "please")
        .json(&json!({"prompt": "Hi", "max_tokens": 2}))
        .send()
        .await
        .expect("bad header");
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.expect("error json");
    assert_eq!(body["error"]["param"], "X-Pagewarden-Receipt", "{body}");
}
