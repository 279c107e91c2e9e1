//! The HTTP surface: auth (401), body limit (413), malformed bodies and bad parameters (400 naming
//! the field), unknown routes, /v1/models, /health, /metrics, and a fuzz over request parsing.

mod common;

use common::{expect_error, Harness, Opts, KEY, MODEL};
use proptest::prelude::*;
use serde_json::{json, Value};

#[tokio::test]
async fn missing_or_bad_key_is_401_and_reaches_no_worker() {
    let h = Harness::start(Opts::default()).await;
    let body = serde_json::to_vec(&json!({"prompt": "hi", "max_tokens": 2})).unwrap();
    for key in [None, Some("sk-wrong")] {
        let r = h.post_raw("/v1/completions", body.clone(), key).await;
        let err = expect_error(r, 401).await;
        assert_eq!(err["code"], "invalid_api_key");
    }
    let r = h.client.get(h.url("/v1/models")).send().await.unwrap();
    expect_error(r, 401).await;
    assert_eq!(h.total_reserves(), 0);
    assert_eq!(h.total_prefills(), 0);
}

#[tokio::test]
async fn oversized_body_is_413() {
    let h = Harness::start(Opts {
        max_body_bytes: 1024,
        ..Opts::default()
    })
    .await;
    let big = json!({"prompt": "a".repeat(4096), "max_tokens": 1});
    let err = expect_error(h.post("/v1/completions", &big).await, 413).await;
    assert_eq!(err["code"], "payload_too_large");
    // Just under the limit is fine.
    let ok = h
        .post(
            "/v1/completions",
            &json!({"prompt": "hello", "max_tokens": 1}),
        )
        .await;
    assert_eq!(ok.status(), 200);
    assert_eq!(h.total_reserves(), 1);
}

#[tokio::test]
async fn malformed_bodies_are_400_with_clear_messages() {
    let h = Harness::start(Opts::default()).await;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{\"prompt\": \"hi\"".to_vec(), "invalid_json"),
        (b"not json".to_vec(), "invalid_json"),
        (b"".to_vec(), "invalid_json"),
        (b"[1,2]".to_vec(), "invalid_json"),
        (b"{\"prompt\": \"\xff\xfe\"}".to_vec(), "invalid_utf8"),
    ];
    for (body, code) in cases {
        for path in ["/v1/completions", "/v1/chat/completions"] {
            let err = expect_error(h.post_raw(path, body.clone(), Some(KEY)).await, 400).await;
            assert_eq!(err["code"], code, "{path} {body:?}");
            let msg = err["message"].as_str().unwrap();
            assert!(msg.contains("JSON") || msg.contains("UTF-8"), "{msg}");
        }
    }
    assert_eq!(h.total_reserves(), 0);
}

#[tokio::test]
async fn bad_parameters_are_400_naming_the_field() {
    let h = Harness::start(Opts::default()).await;
    let completion_cases = [
        (json!({}), "prompt"),
        (json!({"prompt": 5}), "prompt"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": ["a", [1, -2]]}), "prompt[1][1]"),
        (json!({"prompt": [1, -2]}), "prompt[1]"),
        (json!({"prompt": [1, 99999999]}), "prompt[1]"),
        (json!({"prompt": "hi", "max_tokens": 0}), "max_tokens"),
        (
            json!({"prompt": "hi", "echo": true, "stream": true}),
            "echo",
        ),
        (json!({"prompt": "hi", "echo": 1}), "echo"),
        (json!({"prompt": ["a", "b", "c", "d", "e"], "n": 16}), "n"),
        (json!({"prompt": "hi", "max_tokens": "3"}), "max_tokens"),
        (json!({"prompt": "hi", "max_tokens": 1.5}), "max_tokens"),
        (json!({"prompt": "hi", "temperature": 2.5}), "temperature"),
        (json!({"prompt": "hi", "temperature": "hot"}), "temperature"),
        (json!({"prompt": "hi", "top_p": 0}), "top_p"),
        (json!({"prompt": "hi", "top_p": 1.5}), "top_p"),
        (json!({"prompt": "hi", "top_k": -5}), "top_k"),
        (json!({"prompt": "hi", "n": 17}), "n"),
        (json!({"prompt": "hi", "stop": 3}), "stop"),
        (json!({"prompt": "hi", "stop": ["ok", ""]}), "stop[1]"),
        (
            json!({"prompt": "hi", "stop": ["ok", "x".repeat(257)]}),
            "stop[1]",
        ),
        (json!({"prompt": "hi", "stop": "y".repeat(257)}), "stop"),
        (json!({"prompt": "hi", "stream": "yes"}), "stream"),
        (
            json!({"prompt": "hi", "stream_options": {"include_usage": 1}}),
            "stream_options.include_usage",
        ),
        // Unknown or misspelled fields are refused by name, never dropped.
        (json!({"prompt": "hi", "min_p": 1.5}), "min_p"),
        (
            json!({"prompt": "hi", "guided_decoding": "a+"}),
            "guided_decoding",
        ),
        (json!({"prompt": "hi", "max_token": 5}), "max_token"),
        (
            json!({"prompt": "hi", "stream_options": {"include_usage": true, "usage": 1}}),
            "stream_options.usage",
        ),
        (json!({"prompt": "hi", "model": 3}), "model"),
        (json!({"prompt": ""}), "prompt"),
    ];
    for (body, field) in completion_cases {
        let err = expect_error(h.post("/v1/completions", &body).await, 400).await;
        assert_eq!(err["param"], field, "{body}");
        let msg = err["message"].as_str().unwrap();
        assert!(
            msg.contains(field),
            "message `{msg}` does not name `{field}`"
        );
    }
    let chat_cases = [
        (json!({}), "messages"),
        (json!({"messages": []}), "messages"),
        (json!({"messages": "hi"}), "messages"),
        (
            json!({"messages": [{"role": "robot", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": "a"}, 7]}),
            "messages[1]",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1}),
            "max_completion_tokens",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3, "max_tokens": 3}),
            "max_tokens",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "name": {"first": "ann"}}]}),
            "messages[0].name",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache": 1}]}]}),
            "messages[0].content[0].cache",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "guided_decoding": {}}),
            "guided_decoding",
        ),
    ];
    for (body, field) in chat_cases {
        let err = expect_error(h.post("/v1/chat/completions", &body).await, 400).await;
        assert_eq!(err["param"], field, "{body}");
        assert!(err["message"].as_str().unwrap().contains(field));
    }
    let err = expect_error(
        h.post(
            "/v1/completions",
            &json!({"prompt": "hi", "model": "gpt-9"}),
        )
        .await,
        404,
    )
    .await;
    assert_eq!(err["code"], "model_not_found");
    assert_eq!(
        h.total_reserves(),
        0,
        "no invalid request may reach a worker"
    );
}

#[tokio::test]
async fn unknown_route_and_method_are_openai_errors() {
    let h = Harness::start(Opts::default()).await;
    expect_error(h.get("/v1/nope").await, 404).await;
    let wrong_method = h.get("/v1/completions").await;
    let allow = wrong_method
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(
        allow.as_deref(),
        Some("POST"),
        "405 names the allowed method"
    );
    let err = expect_error(wrong_method, 405).await;
    assert_eq!(err["code"], "method_not_allowed");
}

#[tokio::test]
async fn fields_that_carry_nothing_for_generation_are_accepted_and_checked() {
    let h = Harness::start(Opts::default()).await;
    let chat = json!({
        "messages": [{"role": "user", "content": "hi", "name": "ana"}],
        "max_tokens": 2,
        "metadata": {"app": "tests", "run": "7"},
        "store": false,
        "user": "u-1",
        "service_tier": "auto",
    });
    let r = h.post("/v1/chat/completions", &chat).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let r = h
        .post(
            "/v1/completions",
            &json!({"prompt": "hi", "max_tokens": 2, "metadata": {"k": "v"}}),
        )
        .await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (metadata, why) in [
        (json!("x"), "must be an object"),
        (json!({"k": 1}), "values must be strings"),
        (json!({"k": "v".repeat(513)}), "at most 512"),
        (json!({"k".repeat(65): "v"}), "at most 64"),
        (Value::Object(many), "at most 16"),
    ] {
        let body = json!({"prompt": "hi", "max_tokens": 2, "metadata": metadata});
        let err = expect_error(h.post("/v1/completions", &body).await, 400).await;
        assert_eq!(err["param"], "metadata", "{err}");
        assert!(err["message"].as_str().unwrap().contains(why), "{err}");
    }
    let body = json!({"messages": [{"role": "user", "content": "hi", "name": 5}]});
    let err = expect_error(h.post("/v1/chat/completions", &body).await, 400).await;
    assert_eq!(err["param"], "messages[0].name", "{err}");
    assert_eq!(
        h.total_reserves(),
        2,
        "only the two good requests reached a worker"
    );
}

#[tokio::test]
async fn logit_bias_reaches_the_workers_by_token_id_and_bad_ones_name_the_field() {
    let h = Harness::start(Opts::default()).await;
    let body =
        json!({"prompt": "hi", "max_tokens": 2, "logit_bias": {"5": 100, "3": -100.0, "7": 0.5}});
    let r = h.post("/v1/completions", &body).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let chat = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "logit_bias": {"4": 1},
    });
    let r = h.post("/v1/chat/completions", &chat).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let sent: Vec<Vec<(u32, f32)>> = h
        .reserved_sampling()
        .into_iter()
        .map(|r| {
            let mut b: Vec<(u32, f32)> = r.logit_bias.into_iter().collect();
            b.sort_by_key(|&(t, _)| t);
            b
        })
        .collect();
    assert_eq!(
        sent,
        vec![vec![(3, -100.0), (5, 100.0), (7, 0.5)], vec![(4, 1.0)]]
    );
    let many: serde_json::Map<String, Value> =
        (0..301).map(|i| (i.to_string(), json!(1))).collect();
    for (bias, why) in [
        (json!([1, 2]), "must be an object"),
        (json!({"x": 1}), "keys must be token ids"),
        (json!({"-1": 1}), "keys must be token ids"),
        (json!({"5": 100.5}), "between -100 and 100"),
        (json!({"5": "1"}), "between -100 and 100"),
        (json!({"5": 1, "05": 2}), "names token 5 twice"),
        (json!({"100000": 1}), "outside the vocabulary"),
        (Value::Object(many), "at most 300"),
    ] {
        let body = json!({"prompt": "hi", "max_tokens": 2, "logit_bias": bias});
        let err = expect_error(h.post("/v1/completions", &body).await, 400).await;
        assert_eq!(err["param"], "logit_bias", "{err}");
        assert!(
            err["message"].as_str().unwrap().contains(why),
            "{why}: {err}"
        );
    }
    assert_eq!(h.total_reserves(), 2, "no refused request reached a worker");
}

#[tokio::test]
async fn vllm_structured_outputs_reach_the_workers_as_one_grammar_and_bad_ones_name_the_field() {
    use pagewarden_proto::v1::sampling_params::Grammar as Wire;
    use pagewarden_proto::v1::Choices;
    let h = Harness::start(Opts::default()).await;
    let choice = || {
        Wire::Choice(Choices {
            choices: vec!["yes".into(), "no".into()],
        })
    };
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let cases = [
        (
            json!({"structured_outputs": {"choice": ["yes", "no"]}}),
            choice(),
        ),
        (json!({"guided_choice": ["yes", "no"]}), choice()),
        (
            json!({"structured_outputs": {"regex": "[0-9]{3}"}}),
            Wire::Regex("[0-9]{3}".into()),
        ),
        (
            json!({"guided_regex": "[0-9]{3}"}),
            Wire::Regex("[0-9]{3}".into()),
        ),
        (
            json!({"guided_json": schema}),
            Wire::JsonSchema(schema.to_string()),
        ),
        (
            json!({"structured_outputs": {"json": schema.to_string()}}),
            Wire::JsonSchema(schema.to_string()),
        ),
        (
            json!({"structured_outputs": {"json_object": true}}),
            Wire::JsonObject(true),
        ),
    ];
    for (extra, _) in &cases {
        let mut body = json!({"prompt": "hi", "max_tokens": 2});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = h.post("/v1/completions", &body).await;
        assert_eq!(r.status(), 200, "{extra}: {:?}", r.text().await);
    }
    let sent: Vec<Option<Wire>> = h
        .reserved_sampling()
        .into_iter()
        .map(|s| s.grammar)
        .collect();
    let want: Vec<Option<Wire>> = cases.iter().map(|(_, w)| Some(w.clone())).collect();
    assert_eq!(sent, want);
    for (extra, param, why) in [
        (
            json!({"guided_regex": "[0-9]", "guided_choice": ["a"]}),
            "guided_choice",
            "cannot be combined with `guided_regex`",
        ),
        (
            json!({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}),
            "structured_outputs",
            "cannot be combined with `response_format`",
        ),
        (
            json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}),
            "structured_outputs",
            "only one of",
        ),
        (
            json!({"structured_outputs": {}}),
            "structured_outputs",
            "must give one of",
        ),
        (
            json!({"structured_outputs": {"grammar": "root ::= \"a\""}}),
            "structured_outputs.grammar",
            "is not supported",
        ),
        (
            json!({"guided_grammar": "root ::= \"a\""}),
            "guided_grammar",
            "is not supported",
        ),
        (
            json!({"structured_outputs": {"regex": "a", "bogus": 1}}),
            "structured_outputs.bogus",
            "not a recognized parameter",
        ),
        (
            json!({"guided_choice": []}),
            "guided_choice",
            "at least one",
        ),
        (
            json!({"guided_choice": ["a", 3]}),
            "guided_choice[1]",
            "must be a string",
        ),
        (
            json!({"guided_regex": ""}),
            "guided_regex",
            "must not be empty",
        ),
        (
            json!({"guided_regex": "(unclosed"}),
            "guided_regex",
            "`guided_regex`: unsupported grammar",
        ),
        (
            json!({"guided_json": "not json"}),
            "guided_json",
            "must be a JSON schema",
        ),
        (
            json!({"guided_choice": ["a"], "ignore_eos": true}),
            "ignore_eos",
            "cannot be combined with `guided_choice`",
        ),
    ] {
        let mut body = json!({"prompt": "hi", "max_tokens": 2});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let err = expect_error(h.post("/v1/completions", &body).await, 400).await;
        assert_eq!(err["param"], param, "{extra}: {err}");
        assert!(
            err["message"].as_str().unwrap().contains(why),
            "{extra}: {err}"
        );
    }
    assert_eq!(
        h.total_reserves(),
        cases.len(),
        "no refused request reached a worker"
    );
}

#[tokio::test]
async fn the_served_model_is_found_by_id_and_apis_not_served_say_so() {
    let h = Harness::start(Opts::default()).await;
    let model: Value = h
        .get(&format!("/v1/models/{MODEL}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&model["id"], &model["object"]),
        (&json!(MODEL), &json!("model"))
    );
    let err = expect_error(h.get("/v1/models/org/other-model").await, 404).await;
    assert_eq!(err["code"], "model_not_found");
    assert!(
        err["message"].as_str().unwrap().contains("org/other-model"),
        "{err}"
    );
    for path in ["/v1/embeddings", "/v1/responses"] {
        let r = h.post(path, &json!({"model": MODEL, "input": "hi"})).await;
        let err = expect_error(r, 404).await;
        assert_eq!(err["code"], "api_not_served", "{path}: {err}");
        assert!(
            err["message"]
                .as_str()
                .unwrap()
                .contains("/v1/chat/completions"),
            "{err}"
        );
    }
    // Behind the same keys as every other API route.
    let r = h.client.get(h.url("/v1/embeddings")).send().await.unwrap();
    expect_error(r, 401).await;
    assert_eq!(h.total_reserves(), 0);
}

#[tokio::test]
async fn models_health_and_metrics() {
    let h = Harness::start(Opts::default()).await;
    let models: Value = h.get("/v1/models").await.json().await.unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["max_model_len"], 256);
    let health = h.client.get(h.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    // Every worker with its liveness, load and device, and no address (the endpoint is public).
    let health: Value = health.json().await.unwrap();
    let workers = health["workers"].as_array().expect("workers");
    assert_eq!(workers.len(), 2, "{health}");
    assert_eq!(workers[0]["role"], "decode");
    assert_eq!(workers[0]["node_id"], "fake-decode");
    assert_eq!(workers[1]["node_id"], "fake-prefill");
    for w in workers {
        assert_eq!(w["state"], "live", "{w}");
        assert_eq!(w["arithmetic"], "fake", "{w}");
        assert_eq!(w["version"], "test", "{w}");
        assert_eq!(w["context_length"], 256, "{w}");
        assert_eq!(w["total_pages"], w["free_pages"], "{w}");
        assert_eq!(w["queue_depth"], 0, "{w}");
    }
    assert!(!health.to_string().contains("127.0.0.1"), "{health}");
    let r = h
        .post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 2}))
        .await;
    assert_eq!(r.status(), 200);
    let _ = h.post("/v1/completions", &json!({"prompt": 1})).await;
    let m = h.metrics().await;
    for needle in [
        "pagewarden_router_requests_total{endpoint=\"completions\",outcome=\"Completed\"} 1",
        "pagewarden_router_rejections_total{reason=\"invalid_value\"} 1",
        "pagewarden_router_ttft_seconds_count 1",
        "pagewarden_router_inter_token_latency_seconds_count 1",
        "pagewarden_router_phase_seconds_count{phase=\"reserve\"} 1",
        "pagewarden_router_phase_seconds_count{phase=\"prefill\"} 1",
        "pagewarden_router_phase_seconds_count{phase=\"generate\"} 1",
        "pagewarden_router_effective_context_tokens 256",
    ] {
        assert!(m.contains(needle), "metrics lack `{needle}`:\n{m}");
    }
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-10.0f64..10.0).prop_map(Value::from),
        "[a-z ]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("prompt".to_string()),
                    Just("messages".to_string()),
                    Just("role".to_string()),
                    Just("content".to_string()),
                    Just("max_tokens".to_string()),
                    Just("temperature".to_string()),
                    Just("stop".to_string()),
                    Just("stream".to_string()),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Arbitrary bytes and arbitrary JSON never panic the parsers and only ever yield 4xx errors.
    #[test]
    fn parsing_never_panics_and_errors_are_4xx(
        bytes in prop::collection::vec(any::<u8>(), 0..64),
        value in arb_json(),
    ) {
        use pagewarden_router::extract::JsonObject;
        use pagewarden_router::validation::{ValidChatRequest, ValidCompletionRequest};
        for raw in [bytes, serde_json::to_vec(&value).unwrap()] {
            match JsonObject::parse(&raw) {
                Err(e) => prop_assert!(e.status().is_client_error()),
                Ok(obj) => {
                    if let Err(e) = ValidCompletionRequest::parse(&obj.0) {
                        prop_assert_eq!(e.param.is_empty(), false);
                    }
                    if let Err(e) = ValidChatRequest::parse(&obj.0) {
                        prop_assert_eq!(e.param.is_empty(), false);
                    }
                }
            }
        }
    }
}

/// The same fuzz end to end over HTTP (fewer cases): every answer is 2xx or 4xx, never 5xx.
#[tokio::test]
async fn fuzzed_requests_over_http_are_2xx_or_4xx() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let h = Harness::start(Opts::default()).await;
    let mut runner = TestRunner::deterministic();
    let strategy = prop_oneof![
        arb_json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        prop::collection::vec(any::<u8>(), 0..48),
        arb_json()
            .prop_map(|v| { serde_json::to_vec(&json!({"prompt": v, "max_tokens": 2})).unwrap() }),
        arb_json().prop_map(|v| {
            serde_json::to_vec(
                &json!({"messages": [{"role": "user", "content": v}], "max_tokens": 2}),
            )
            .unwrap()
        }),
    ];
    for i in 0..96 {
        let body = strategy.new_tree(&mut runner).unwrap().current();
        let path = if i % 2 == 0 {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let r = h.post_raw(path, body.clone(), Some(KEY)).await;
        let s = r.status().as_u16();
        assert!(
            (200..300).contains(&s) || (400..500).contains(&s),
            "{path} answered {s} to {:?}",
            String::from_utf8_lossy(&body)
        );
    }
}

#[tokio::test]
async fn tokenize_detokenize_and_version() {
    let h = Harness::start(Opts::default()).await;
    let text = "hello world, tokens";
    let r = h.post("/tokenize", &json!({"prompt": text})).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(ids, h.tokens(text), "the router's own tokenization");
    assert_eq!(v["count"], ids.len());

    let r = h.post("/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["prompt"], text);

    // vLLM's add_special_tokens: false leaves BOS out (lm-evaluation-harness tokenizes so).
    let r = h
        .post(
            "/tokenize",
            &json!({"prompt": text, "add_special_tokens": false}),
        )
        .await;
    let v: Value = r.json().await.unwrap();
    let plain: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(plain, h.state.frontend.tokenizer().encode(text, true));
    // vLLM's tokenizer_info, which remote-tokenizer clients read first.
    let r = h
        .client
        .get(h.url("/tokenizer_info"))
        .bearer_auth(common::KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let info: Value = r.json().await.unwrap();
    assert!(info["eos_token"].is_string(), "{info}");
    assert!(info["chat_template"].is_string(), "{info}");
    assert_eq!(
        info["vocab_size"],
        h.state.frontend.tokenizer().vocab_size()
    );

    let chat = h
        .post(
            "/tokenize",
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(chat.status(), 200);
    let v: Value = chat.json().await.unwrap();
    assert!(v["count"].as_u64().unwrap() > 1);

    let cases = [
        (
            "/tokenize",
            json!({"prompt": "x", "add_special": true}),
            "add_special",
        ),
        ("/tokenize", json!({}), "prompt"),
        ("/detokenize", json!({"tokens": [1, 99999999]}), "tokens[1]"),
        ("/detokenize", json!({"tokens": "1 2"}), "tokens"),
    ];
    for (path, body, field) in cases {
        let err = expect_error(h.post(path, &body).await, 400).await;
        assert_eq!(err["param"], field, "{path} {body}");
    }
    let r = h
        .post_raw("/tokenize", b"{\"prompt\":\"x\"}".to_vec(), None)
        .await;
    expect_error(r, 401).await;

    let r = h.client.get(h.url("/version")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert!(v["version"].is_string());
    assert_eq!(h.total_reserves(), 0, "no worker is involved");
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}
    }})
}

/// Workers with room for a prompt that lists tools (the tiny vocabulary spends a token on
/// about every byte); decode's reply is these token texts, then end of generation.
fn scripted(texts: &[&str]) -> Opts {
    let roomy = common::fakes::FakeOpts {
        context_length: 4096,
        pool_tokens: 16_384,
        ..Default::default()
    };
    Opts {
        decode: vec![common::fakes::FakeOpts {
            script: (!texts.is_empty()).then(|| texts.iter().map(|t| t.to_string()).collect()),
            ..roomy.clone()
        }],
        prefill: vec![roomy],
        ..Opts::default()
    }
}

#[tokio::test]
async fn tool_calls_are_read_from_the_reply_whole_and_streamed() {
    let reply = [
        "Let",
        " me",
        " check.",
        "<tool",
        "_call>",
        "{\"name\": \"get_weather\", ",
        "\"arguments\": {\"city\": \"Oslo\"}}",
        "</tool_call>",
    ];
    let h = Harness::start(scripted(&reply)).await;
    let mut body = json!({
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [weather_tool()],
        "max_tokens": 50,
    });
    let r = h.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], "Let me check.");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Oslo"}));

    // Streamed: the text as content deltas, the call in one delta, then the end.
    body["stream"] = json!(true);
    let (chunks, text) = h.stream_chunks("/v1/chat/completions", &body).await;
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "Let me check.", "{text}");
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
        .collect();
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(calls[0][0]["index"], 0);
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );

    // tool_choice none: the same reply is text.
    body["stream"] = json!(false);
    body["tool_choice"] = json!("none");
    let v: Value = h
        .post("/v1/chat/completions", &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["message"]["content"], reply.concat());
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
}

#[tokio::test]
async fn a_reply_that_is_not_a_call_is_text_whole() {
    let reply = ["It is ", "<tool_call>", "{\"name\": ", "oops"];
    let h = Harness::start(scripted(&reply)).await;
    for stream in [false, true] {
        let body = json!({
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [weather_tool()],
            "stream": stream,
        });
        let r = h.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        let content: String = if stream {
            common::sse_data(&text)
                .iter()
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .filter_map(|c| {
                    c["choices"][0]["delta"]["content"]
                        .as_str()
                        .map(String::from)
                })
                .collect()
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(content, reply.concat(), "stream {stream}");
    }
}

#[tokio::test]
async fn tool_turns_and_forced_choices_reach_the_workers() {
    use pagewarden_proto::v1::sampling_params::Grammar as Wire;
    let h = Harness::start(scripted(&[])).await;
    let conversation = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"},
    ]);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for choice in [json!("auto"), json!("required"), named.clone()] {
        let body = json!({"messages": conversation, "tools": [weather_tool()],
            "tool_choice": choice, "max_tokens": 4, "parallel_tool_calls": false});
        let r = h.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status(), 200, "{choice}: {:?}", r.text().await);
    }
    let sent: Vec<Option<Wire>> = h
        .reserved_sampling()
        .into_iter()
        .map(|s| s.grammar)
        .collect();
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[0], None, "auto is not constrained");
    let Some(Wire::JsonSchema(required)) = &sent[1] else {
        panic!("required is constrained: {:?}", sent[1]);
    };
    let required: Value = serde_json::from_str(required).unwrap();
    assert_eq!(
        required["anyOf"][0]["properties"]["name"]["const"],
        "get_weather"
    );
    // The named function's parameters, closed to other keys.
    let mut closed = weather_tool()["function"]["parameters"].clone();
    closed["additionalProperties"] = json!(false);
    assert_eq!(sent[2], Some(Wire::JsonSchema(closed.to_string())));
    // The prompt holds the call and its result (the tiny model's template has no tool
    // support: they are rendered as Hermes text).
    let prompt = h.decode[0].calls.lock().reserve[0].prompt_token_ids.clone();
    let text = h.state.frontend.tokenizer().decode(&prompt);
    assert!(
        text.contains("<tool_response>\n{\"temp\": 3}\n</tool_response>"),
        "{text}"
    );
    assert!(
        text.contains("\"arguments\": {\"city\": \"Oslo\"}"),
        "{text}"
    );
    assert!(text.contains("<tools>"), "{text}");

    for (body, param) in [
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "tools": [weather_tool()],
                "tool_choice": named, "response_format": {"type": "json_object"}}),
            "tool_choice",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
            "tools[0].function.parameters",
        ),
    ] {
        let err = expect_error(h.post("/v1/chat/completions", &body).await, 400).await;
        assert_eq!(err["param"], param, "{err}");
    }
    assert_eq!(
        h.total_reserves(),
        3,
        "only the good requests reached a worker"
    );
}

#[tokio::test]
async fn n_choices_each_with_its_seed_whole_and_streamed() {
    let h = Harness::start(Opts::default()).await;
    let body = json!({"prompt": "hi", "max_tokens": 3, "n": 3, "seed": 5});
    let v: Value = h.post("/v1/completions", &body).await.json().await.unwrap();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(v["usage"]["prompt_tokens"], h.tokens("hi").len());
    assert_eq!(v["usage"]["completion_tokens"], 9, "{v}");
    let seeds: Vec<Option<u64>> = h.reserved_sampling().into_iter().map(|s| s.seed).collect();
    let mut sorted = seeds.clone();
    sorted.sort();
    assert_eq!(sorted, vec![Some(5), Some(6), Some(7)], "seed + index");

    let mut chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "n": 2, "stream": true, "stream_options": {"include_usage": true}});
    let (chunks, text) = h.stream_chunks("/v1/chat/completions", &chat).await;
    for i in 0..2 {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["choices"][0]["index"] == i)
            .collect();
        assert_eq!(
            mine[0]["choices"][0]["delta"]["role"], "assistant",
            "{text}"
        );
        assert_eq!(
            mine.last().unwrap()["choices"][0]["finish_reason"],
            "length",
            "{text}"
        );
        let content: String = mine
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "w0 w1 w2 ", "{text}");
    }
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 6, "{text}");
    // A batch of prompts: n choices each, indexed on across the batch, seeds running on.
    let body = json!({"prompt": ["hi", [5, 6, 7]], "max_tokens": 2, "n": 2, "seed": 20});
    let v: Value = h.post("/v1/completions", &body).await.json().await.unwrap();
    let indices: Vec<u64> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [0, 1, 2, 3], "{v}");
    assert_eq!(
        v["usage"]["prompt_tokens"],
        h.tokens("hi").len() + 3,
        "each prompt once: {v}"
    );
    assert_eq!(v["usage"]["completion_tokens"], 8);
    let mut seeds: Vec<Option<u64>> = h
        .reserved_sampling()
        .into_iter()
        .map(|s| s.seed)
        .filter(|s| s.is_some_and(|s| s >= 20))
        .collect();
    seeds.sort();
    assert_eq!(seeds, [Some(20), Some(21), Some(22), Some(23)]);
    chat["n"] = json!(0);
    let err = expect_error(h.post("/v1/chat/completions", &chat).await, 400).await;
    assert_eq!(err["param"], "n");
}
