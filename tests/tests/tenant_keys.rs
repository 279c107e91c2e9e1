//! Tenant API keys are stored hashed, `pagewarden keys` edits the tenants file, and
//! the router reloads it on SIGHUP: an added key works, a revoked one gets 401, a broken file
//! keeps the previous keys, and a stream in flight across the reloads runs to its end.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use pagewarden_system_tests::{
    api_key, bin_dir, start_decode, start_prefill, start_router, ModelArg, Service,
};
use pagewarden_testkit::{eventually, poll_until};
use serde_json::json;

const TINY: ModelArg = ModelArg::Tiny(11);

/// Runs `pagewarden keys ARGS --file FILE`; returns its stdout.
fn keys(args: &[&str], file: &Path) -> String {
    let out = Command::new(bin_dir().join("pagewarden"))
        .arg("keys")
        .args(args)
        .arg("--file")
        .arg(file)
        .output()
        .expect("run pagewarden keys");
    assert!(
        out.status.success(),
        "pagewarden keys {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The status of a small completion with `key`.
async fn status(router: &Service, key: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(key)
        .json(&json!({"model": "m", "prompt": "hi", "max_tokens": 1}))
        .send()
        .await
        .expect("router answers")
        .status()
        .as_u16()
}

/// Polls until `key` gets `want` (the reload is asynchronous to the signal); panics after 10 s.
async fn wait_status(router: &Service, key: &str, want: u16) {
    eventually(
        Duration::from_secs(10),
        &format!("the key to answer {want}"),
        || async {
            let got = status(router, key).await;
            if got == want {
                Ok(())
            } else {
                Err(format!("it answered {got}"))
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_added_and_revoked_take_effect_on_sighup_without_dropping_a_stream() {
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    let router = start_router(&TINY, &[&decode], &[&prefill]).await;
    let file = router.files.as_ref().unwrap().path().join("tenants.toml");
    assert_eq!(status(&router, &api_key(1)).await, 200);

    // A stream in flight across every reload below.
    let stream = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(0))
        .json(&json!({"model": "m", "prompt": "a long story", "max_tokens": 64, "stream": true}))
        .send()
        .await
        .expect("stream starts");
    assert_eq!(stream.status(), 200);
    let mut body = stream.bytes_stream();
    let mut seen = String::from_utf8(body.next().await.unwrap().unwrap().to_vec()).unwrap();
    assert!(seen.starts_with("data: "), "{seen}");

    let new_key = keys(&["add", "--tenant", "newco"], &file);
    assert!(
        new_key.starts_with("pw-") && new_key.len() == 35,
        "{new_key}"
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        !text.contains(&new_key),
        "the clear key reached the file:\n{text}"
    );
    keys(
        &["revoke", "--tenant", "tenant-1", "--key", &api_key(1)],
        &file,
    );
    // Nothing changes before the signal.
    assert_eq!(status(&router, &new_key).await, 401);
    assert_eq!(status(&router, &api_key(1)).await, 200);

    router.signal("HUP");
    wait_status(&router, &new_key, 200).await;
    assert_eq!(status(&router, &api_key(1)).await, 401);
    assert_eq!(status(&router, &api_key(2)).await, 200);

    // A broken file on reload is refused and the keys in force stay.
    std::fs::write(&file, "[[tenants]]\nname = \"x\"\nkeys = [\"plain\"]\n").unwrap();
    router.signal("HUP");
    // The router says nothing of a refused reload: watched for 500 ms of real time, the keys
    // must stay what they were.
    let changed = poll_until(Duration::from_millis(500), || async {
        let now = (
            status(&router, &new_key).await,
            status(&router, "plain").await,
        );
        (now != (200, 401)).then_some(now)
    })
    .await;
    assert_eq!(changed, None, "(new key, plain) answered otherwise");

    while let Some(chunk) = body.next().await {
        seen.push_str(&String::from_utf8_lossy(
            &chunk.expect("the stream was not dropped"),
        ));
    }
    assert!(seen.trim_end().ends_with("data: [DONE]"), "{seen}");
}
