//! The official `openai` Python SDK against the suite (router → prefill → decode, the real
//! model), as an application drives it: tool calls (named, required, auto; whole and streamed)
//! whose arguments parse under the function's schema, the call and its result sent back,
//! `logit_bias` forcing a token, and fields without generation semantics (`metadata`, `store`,
//! `user`, `service_tier`) accepted; then LangChain's `bind_tools` (a forced call parsed into
//! its tool call, the result sent back). The checks are in `openai_sdk.py` beside this file;
//! scripts/test.sh installs the SDK and LangChain.

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
}
