//! The official `openai` Python SDK against the suite (router → prefill → decode, the real
//! model), as an application drives it: tool calls (named, required, auto; whole and streamed)
//! whose arguments parse under the function's schema, the call and its result sent back,
//! `logit_bias` forcing a token, `echo` + `logprobs` + `max_tokens: 0` scoring a prompt as
//! a generation over each prefix scores it, and fields without generation semantics (`metadata`, `store`,
//! `user`, `service_tier`) accepted; then LangChain's `bind_tools` (a forced call parsed into
//! its tool call, the result sent back). The checks are in `openai_sdk.py` beside this file;
//! scripts/test.sh installs the SDK, LangChain and lm-evaluation-harness, whose
//! `local-completions` then scores a small multiple-choice task (`lm_eval_mc.py`). Then `n = 4`: four texts under one seed, and
//! the prompt computed by prefill once.

use std::process::Command;

use pagewarden_system_tests::{api_key, start_decode, start_prefill, start_router, ModelArg};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_runs_tool_calls_and_the_rest_against_the_suite() {
    let model = ModelArg::Real;
    let decode = start_decode(&model, &["--pool-tokens", "8192"]);
    let prefill = start_prefill(&model, &["--pool-tokens", "8192"]);
    let router = start_router(&model, &[&decode], &[&prefill]).await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_sdk.py");
    let base = router.http_url();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(&script)
            .args([base.as_str(), api_key(0).as_str(), "m"])
            .output()
            .expect("python3 runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("openai SDK saw: {stdout}");
    assert!(
        out.status.success(),
        "the SDK's checks failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).expect("a JSON summary");
    assert_eq!(seen["named"]["name"], "get_weather");
    assert_eq!(seen["metadata"], "accepted");
    assert!(seen["langchain"]["call"]["city"].is_string(), "{seen}");
    assert!(seen["echo"]["tokens"].as_u64() > Some(5), "{seen}");

    // lm-evaluation-harness's local-completions, tokenizing through the server, on a small
    // multiple-choice task it reads from a local file.
    let work = tempfile::tempdir().expect("tempdir");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lm_eval_mc.py");
    let (base, dir) = (router.http_url(), work.path().to_path_buf());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(&script)
            .args([base.as_str(), api_key(0).as_str(), "m"])
            .arg(&dir)
            .output()
            .expect("python3 runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("lm-eval: {}", stdout.lines().last().unwrap_or_default());
    assert!(
        out.status.success(),
        "lm-evaluation-harness failed ({}):\n{}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lm: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("a JSON summary");
    assert_eq!(lm["items"].as_array().map(Vec::len), Some(8), "{lm}");
    assert!(lm["acc"].as_f64().is_some(), "{lm}");

    // n = 4 over a prompt no request sent before: four choices of their own seeds, and the
    // prompt computed by prefill once (the later choices reuse its pages from the cache).
    let computed = || async {
        let text = prefill.metrics().await;
        sum(&text, "vllm:prefix_cache_queries") - sum(&text, "vllm:prefix_cache_hits")
    };
    let before = computed().await;
    let words: Vec<String> = (0..90).map(|i| format!("w{}", i * 7 % 31)).collect();
    let body = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": format!("Continue this list: {}", words.join(" "))}],
        "n": 4, "seed": 11, "temperature": 1.0, "max_tokens": 16,
    });
    let (status, v) =
        pagewarden_system_tests::post_json(&router, "/v1/chat/completions", 0, &body).await;
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().expect("choices");
    let texts: Vec<&str> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i, "{v}");
            c["message"]["content"].as_str().expect("content")
        })
        .collect();
    assert_eq!(texts.len(), 4, "{v}");
    let distinct: std::collections::BTreeSet<&str> = texts.iter().copied().collect();
    assert_eq!(distinct.len(), 4, "four seeds, four texts: {texts:?}");
    let prompt = v["usage"]["prompt_tokens"].as_f64().expect("usage");
    let completion: f64 = v["usage"]["completion_tokens"].as_f64().expect("usage");
    assert!(completion > 16.0, "usage counts every choice: {v}");
    let computed = computed().await - before;
    eprintln!(
        "n=4: prompt {prompt} tokens; prefill computed {computed} tokens for the four choices"
    );
    assert!(
        computed < 2.0 * prompt,
        "the later choices reuse the first one's prompt pages: prefill computed {computed} \
         tokens for a {prompt}-token prompt and 4 choices"
    );
}

/// The sum of every sample of the counter `name` (any labels) in a `/metrics` text.
fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with("_total") || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
