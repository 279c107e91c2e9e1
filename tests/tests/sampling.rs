//! The sampling surface through the whole suite (router → prefill → decode as real
//! processes, the real model): logprobs equal the single-process engine's log-softmax, in both
//! OpenAI shapes, whole and streamed; `logit_bias` and vLLM's extensions (penalties, `min_tokens`,
//! `stop_token_ids`, `ignore_eos`) are honoured, the same way the engine honours them;
//! `response_format` JSON schemas are met by every sampled answer; an out-of-range value is a
//! 400 naming the field.

use futures::StreamExt;
use pagewarden_model::{Engine, GenerationOutput, SamplingParams};
use pagewarden_system_tests::{
    post_json, post_sse, reference, start_decode, start_prefill, start_router, ModelArg, Service,
};
use serde_json::{json, Value};

const REAL: ModelArg = ModelArg::Real;
const TINY: ModelArg = ModelArg::Tiny(11);

/// A router over one decode and one prefill worker, and the in-process engine of their model.
struct Suite {
    router: Service,
    engine: Engine,
    _workers: [Service; 2],
}

async fn suite(model: ModelArg) -> Suite {
    let decode = start_decode(&model, &["--pool-tokens", "8192"]);
    let prefill = start_prefill(&model, &["--pool-tokens", "8192"]);
    let router = start_router(&model, &[&decode], &[&prefill]).await;
    Suite {
        router,
        engine: reference::engine(reference::load(&model)),
        _workers: [decode, prefill],
    }
}

impl Suite {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        post_json(&self.router, path, 0, &body).await
    }

    /// A 200 body.
    async fn ok(&self, path: &str, body: Value) -> Value {
        let (status, v) = self.post(path, body).await;
        assert_eq!(status, 200, "{v}");
        v
    }

    /// The data chunks of a streamed response (with a usage chunk), `[DONE]` excluded.
    async fn stream(&self, path: &str, mut body: Value) -> Vec<Value> {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        post_sse(&self.router, path, 1, &body).await
    }

    /// The token ids `/tokenize` gives for a conversation (what chat generation runs on).
    async fn chat_ids(&self, messages: &Value) -> Vec<u32> {
        let v = self.ok("/tokenize", json!({ "messages": messages })).await;
        ids(&v["tokens"])
    }

    fn generate(&self, prompt: &[u32], p: SamplingParams) -> GenerationOutput {
        self.engine.generate(prompt, &p).expect("engine generate")
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|t| t.as_u64().expect("an id") as u32)
        .collect()
}

/// `base` with the fields of `extra` set.
fn with(base: &Value, extra: Value) -> Value {
    let mut body = base.clone();
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    body
}

fn f(v: &Value) -> f32 {
    v.as_f64().unwrap_or_else(|| panic!("a number, got {v}")) as f32
}

fn close(got: f32, want: f32, what: &str) {
    assert!(
        (got - want).abs() < 1e-4,
        "{what}: router {got}, engine {want}"
    );
}

fn greedy_with_logprobs(max_tokens: usize, top: usize) -> SamplingParams {
    SamplingParams {
        logprobs: Some(top),
        ..SamplingParams::greedy(max_tokens)
    }
}

fn completion_tokens(v: &Value) -> u64 {
    v["usage"]["completion_tokens"].as_u64().expect("usage")
}

/// Checks a chat `logprobs.content[]` against the engine's tokens and logprobs.
fn check_chat_content(s: &Suite, content: &[Value], want: &GenerationOutput, top: usize) {
    let tok = s.engine.model().tokenizer();
    assert_eq!(content.len(), want.tokens.len(), "{content:?}");
    for (i, (c, (&id, lp))) in content
        .iter()
        .zip(want.tokens.iter().zip(&want.logprobs))
        .enumerate()
    {
        let bytes: Vec<u8> = c["bytes"]
            .as_array()
            .expect("bytes")
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(bytes, tok.token_bytes(id), "token {i}: {c}");
        assert_eq!(
            c["token"].as_str(),
            Some(String::from_utf8_lossy(tok.token_bytes(id)).as_ref())
        );
        close(f(&c["logprob"]), lp.chosen.logprob, &format!("token {i}"));
        let tops = c["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(tops.len(), top, "{c}");
        for (j, (t, w)) in tops.iter().zip(&lp.top).enumerate() {
            close(f(&t["logprob"]), w.logprob, &format!("token {i} top {j}"));
            assert_eq!(
                t["bytes"].as_array().map(Vec::len),
                Some(tok.token_bytes(w.token).len())
            );
        }
        let values: Vec<f32> = tops.iter().map(|t| f(&t["logprob"])).collect();
        assert!(
            values.windows(2).all(|w| w[0] >= w[1]),
            "sorted: {values:?}"
        );
        // Greedy: the chosen token is the most likely one.
        assert_eq!(values[0], f(&c["logprob"]), "token {i}: {c}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_equal_the_engines_log_softmax_whole_and_streamed() {
    let s = suite(REAL).await;
    let messages = json!([{"role": "user", "content": "Name three colors."}]);
    let prompt = s.chat_ids(&messages).await;
    let want = s.generate(&prompt, greedy_with_logprobs(10, 4));
    assert_eq!(want.logprobs.len(), want.tokens.len());
    let body = json!({"messages": messages, "max_tokens": 10, "temperature": 0,
                      "logprobs": true, "top_logprobs": 4});
    let v = s.ok("/v1/chat/completions", body.clone()).await;
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str(),
        Some(want.text.as_str())
    );
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("logprobs.content: {v}"));
    check_chat_content(&s, content, &want, 4);

    // Streamed: every token's entry arrives in some chunk, in order, with the same values.
    let chunks = s.stream("/v1/chat/completions", body).await;
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter_map(|c| c["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    check_chat_content(&s, &streamed, &want, 4);

    // Without `logprobs` there are none.
    let plain = json!({"messages": messages, "max_tokens": 2, "temperature": 0});
    let v = s.ok("/v1/chat/completions", plain).await;
    assert!(v["choices"][0]["logprobs"].is_null(), "{v}");

    // Completions, legacy shape, whole and streamed.
    let prompt = s
        .engine
        .model()
        .tokenizer()
        .encode("The capital of France is", true);
    let want = s.generate(&prompt, greedy_with_logprobs(8, 2));
    let body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 2});
    let v = s.ok("/v1/completions", body.clone()).await;
    let lp = &v["choices"][0]["logprobs"];
    let check_legacy =
        |tokens: &[Value], token_logprobs: &[Value], tops: &[Value], offsets: &[Value]| {
            assert_eq!(token_logprobs.len(), want.tokens.len(), "{lp}");
            let mut offset = 0;
            for i in 0..want.tokens.len() {
                close(
                    f(&token_logprobs[i]),
                    want.logprobs[i].chosen.logprob,
                    &format!("token {i}"),
                );
                let top = tops[i].as_object().expect("a dict");
                let best = top.values().map(f).fold(f32::NEG_INFINITY, f32::max);
                close(
                    best,
                    want.logprobs[i].top[0].logprob,
                    &format!("top of token {i}"),
                );
                assert_eq!(best, f(&token_logprobs[i]), "greedy picks the most likely");
                assert_eq!(offsets[i].as_u64(), Some(offset), "text_offset {i}");
                offset += tokens[i].as_str().unwrap().chars().count() as u64;
            }
        };
    let arr = |k: &str| {
        lp[k]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("{k}: {lp}"))
    };
    check_legacy(
        &arr("tokens"),
        &arr("token_logprobs"),
        &arr("top_logprobs"),
        &arr("text_offset"),
    );
    let chunks = s.stream("/v1/completions", body).await;
    let cat = |k: &str| -> Vec<Value> {
        chunks
            .iter()
            .filter_map(|c| c["choices"].get(0))
            .filter_map(|c| c["logprobs"][k].as_array())
            .flatten()
            .cloned()
            .collect()
    };
    check_legacy(
        &cat("tokens"),
        &cat("token_logprobs"),
        &cat("top_logprobs"),
        &cat("text_offset"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalties_and_logit_bias_change_the_greedy_text_exactly_as_the_engine_does() {
    let s = suite(REAL).await;
    let prompt = s.engine.model().tokenizer().encode(
        "red blue red blue red blue red blue red blue red blue",
        true,
    );
    let base = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0});
    let run = |extra: Value| with(&base, extra);
    let plain = s.ok("/v1/completions", run(json!({}))).await;
    let plain = plain["choices"][0]["text"].as_str().unwrap().to_string();
    for (extra, p) in [
        (
            json!({"repetition_penalty": 1.5}),
            SamplingParams {
                repetition_penalty: 1.5,
                ..SamplingParams::greedy(12)
            },
        ),
        (
            json!({"frequency_penalty": 1.5}),
            SamplingParams {
                frequency_penalty: 1.5,
                ..SamplingParams::greedy(12)
            },
        ),
        (
            json!({"presence_penalty": 1.5, "min_p": 0.05}),
            SamplingParams {
                presence_penalty: 1.5,
                min_p: 0.05,
                ..SamplingParams::greedy(12)
            },
        ),
    ] {
        let v = s.ok("/v1/completions", run(extra.clone())).await;
        let text = v["choices"][0]["text"].as_str().unwrap();
        assert_ne!(text, plain, "{extra} changed nothing");
        assert_eq!(
            text,
            s.generate(&prompt, p).text,
            "{extra}: router vs engine"
        );
    }

    // logit_bias: −100 bans the greedy first token; +100 forces a token at every step, in
    // prefill's first token and in decode's after it.
    let greedy = s.generate(&prompt, SamplingParams::greedy(12));
    let first = greedy.tokens[0];
    // A prompt token the greedy run does not start with.
    let forced = *prompt.iter().rev().find(|&&t| t != first).unwrap();
    for (bias, max_tokens) in [(vec![(first, -100.0f32)], 12), (vec![(forced, 100.0)], 4)] {
        let json_bias: serde_json::Map<String, Value> = bias
            .iter()
            .map(|&(t, b)| (t.to_string(), json!(b)))
            .collect();
        let extra = json!({"logit_bias": json_bias, "max_tokens": max_tokens});
        let v = s.ok("/v1/completions", run(extra.clone())).await;
        let want = s.generate(
            &prompt,
            SamplingParams {
                logit_bias: bias.clone(),
                ..SamplingParams::greedy(max_tokens)
            },
        );
        assert_eq!(
            v["choices"][0]["text"].as_str(),
            Some(want.text.as_str()),
            "{extra}: router vs engine"
        );
        if bias[0].1 > 0.0 {
            assert_eq!(want.tokens, vec![forced; 4], "{extra}");
        } else {
            assert_ne!(want.tokens[0], first, "{extra}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_tokens_stop_token_ids_and_ignore_eos_decide_where_generation_ends() {
    let s = suite(REAL).await;
    let messages = json!([{"role": "user", "content": "Say hello."}]);
    let prompt = s.chat_ids(&messages).await;
    let free = s.generate(&prompt, SamplingParams::greedy(64));
    assert_eq!(
        free.finish_reason.as_str(),
        "stop",
        "the prompt must end on its own: {free:?}"
    );
    let n = free.tokens.len();
    let base = json!({"messages": messages, "max_tokens": 64, "temperature": 0});
    let chat = |extra: Value| with(&base, extra);
    let v = s.ok("/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(completion_tokens(&v), n as u64, "{v}");

    // min_tokens: the end-of-generation token is masked until n + 4 tokens exist.
    let v = s
        .ok("/v1/chat/completions", chat(json!({"min_tokens": n + 4})))
        .await;
    assert!(completion_tokens(&v) >= n as u64 + 4, "{v}");

    // ignore_eos: runs to max_tokens.
    let v = s
        .ok(
            "/v1/chat/completions",
            chat(json!({"ignore_eos": true, "max_tokens": n + 6})),
        )
        .await;
    assert_eq!(completion_tokens(&v), n as u64 + 6, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"].as_str(), Some("length"));

    // stop_token_ids: ends before the first occurrence of a token the free run produces.
    let (at, stop_id) = free
        .tokens
        .iter()
        .enumerate()
        .skip(1)
        .find(|(i, t)| !free.tokens[..*i].contains(t))
        .map(|(i, &t)| (i, t))
        .expect("a token that first appears after the first");
    let v = s
        .ok(
            "/v1/chat/completions",
            chat(json!({"stop_token_ids": [stop_id]})),
        )
        .await;
    assert_eq!(completion_tokens(&v), at as u64, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"].as_str(), Some("stop"));
    let want = s.engine.model().tokenizer().decode(&free.tokens[..at]);
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str(),
        Some(want.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_values_in_range_are_served_and_out_of_range_ones_are_400s_naming_the_field() {
    let s = suite(TINY).await;
    let in_range = json!({"prompt": "hello", "max_tokens": 3, "temperature": 0.7, "seed": 1,
        "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "ignore_eos": true, "min_tokens": 2,
        "stop_token_ids": [7], "logprobs": 3});
    let v = s.ok("/v1/completions", in_range).await;
    assert_eq!(
        v["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .map(Vec::len),
        Some(completion_tokens(&v) as usize),
        "{v}"
    );
    let chat_ok = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "logprobs": true, "top_logprobs": 20});
    s.ok("/v1/chat/completions", chat_ok).await;

    let completions = [
        ("min_p", json!(1.5), "min_p"),
        ("repetition_penalty", json!(0), "repetition_penalty"),
        ("repetition_penalty", json!(11), "repetition_penalty"),
        ("presence_penalty", json!(2.5), "presence_penalty"),
        ("frequency_penalty", json!(-3), "frequency_penalty"),
        ("min_tokens", json!(5), "min_tokens"),
        ("stop_token_ids", json!([-1]), "stop_token_ids[0]"),
        ("stop_token_ids", json!(7), "stop_token_ids"),
        ("ignore_eos", json!("yes"), "ignore_eos"),
        ("logprobs", json!(21), "logprobs"),
    ];
    let chat = [
        ("top_logprobs", json!(21), "top_logprobs"),
        ("top_logprobs", json!(2), "top_logprobs"),
        ("logprobs", json!(3), "logprobs"),
        (
            "response_format",
            json!({"type": "xml"}),
            "response_format.type",
        ),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}),
            "response_format.json_schema.schema",
        ),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}}),
            "response_format.json_schema.extra",
        ),
        // A schema the grammar library cannot compile (an unknown type) is refused up front.
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x",
                "schema": {"type": "frobnicate"}}}),
            "response_format",
        ),
    ];
    let prompt_base = json!({"prompt": "hello", "max_tokens": 4});
    let chat_base = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let cases = completions
        .into_iter()
        .map(|(k, v, field)| {
            (
                "/v1/completions",
                with(&prompt_base, json!({ k: v })),
                field,
            )
        })
        .chain(chat.into_iter().map(|(k, v, field)| {
            (
                "/v1/chat/completions",
                with(&chat_base, json!({ k: v })),
                field,
            )
        }));
    for (path, body, field) in cases {
        let (status, v) = s.post(path, body.clone()).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"].as_str(), Some(field), "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(
            msg.contains(field),
            "{body}: message names `{field}`: {msg}"
        );
    }
}

/// The schema of the constrained-decoding test: every field bounded, so that a complete
/// document fits in `max_tokens`.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                "minItems": 1, "maxItems": 3},
            "member": {"type": "boolean"}
        },
        "required": ["name", "age", "colors", "member"],
        "additionalProperties": false
    })
}

/// Whether `text` is a JSON document valid under [`person_schema`] (checked by hand, field by
/// field, so the test does not trust the grammar library it is testing).
fn meets_person_schema(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e}): {text:?}"))?;
    let o = v.as_object().ok_or(format!("not an object: {text:?}"))?;
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["age", "colors", "member", "name"] {
        return Err(format!("keys {keys:?}: {text:?}"));
    }
    let name = o["name"].as_str().ok_or("name is not a string")?;
    let chars = name.chars().count();
    let age = o["age"].as_i64().ok_or("age is not an integer")?;
    let colors = o["colors"].as_array().ok_or("colors is not an array")?;
    let ok = (1..=24).contains(&chars)
        && (0..=120).contains(&age)
        && (1..=3).contains(&colors.len())
        && colors
            .iter()
            .all(|c| matches!(c.as_str(), Some("red" | "green" | "blue")))
        && o["member"].is_boolean();
    ok.then_some(())
        .ok_or(format!("out of the schema: {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_schema_is_met_by_every_sampled_answer_and_is_needed_for_it() {
    let s = suite(REAL).await;
    let messages = json!([{"role": "user", "content":
        "Describe a person with a name, an age, favourite colors and whether they are a member."}]);
    let body = |seed: u64, constrained: bool| {
        let mut b = json!({"messages": messages, "max_tokens": 96, "temperature": 1.0,
            "seed": seed});
        if constrained {
            b["response_format"] = json!({"type": "json_schema",
                "json_schema": {"name": "person", "schema": person_schema(), "strict": true}});
        }
        b
    };
    // 20 sampled answers under the schema, each a complete valid document (four at a time:
    // the point is the grammar, not the queue).
    let constrained: Vec<(u16, Value)> = futures::stream::iter(0..20)
        .map(|seed| s.post("/v1/chat/completions", body(seed, true)))
        .buffered(4)
        .collect()
        .await;
    for (seed, (status, v)) in constrained.iter().enumerate() {
        assert_eq!(*status, 200, "seed {seed}: {v}");
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "seed {seed}: {v}");
        let text = choice["message"]["content"].as_str().expect("content");
        if let Err(e) = meets_person_schema(text) {
            panic!("seed {seed}: {e}");
        }
    }
    // The control: the same requests unconstrained do not all meet it, so the passes above
    // come from the constraint, not from the prompt.
    let free = futures::future::join_all(
        (0..4).map(|seed| s.post("/v1/chat/completions", body(seed, false))),
    )
    .await;
    let free_ok = free
        .iter()
        .filter(|(_, v)| {
            let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
            meets_person_schema(text).is_ok()
        })
        .count();
    assert!(
        free_ok < free.len(),
        "every unconstrained answer met the schema too"
    );

    // Streamed, and on /v1/completions with json_object: the text is a JSON object.
    let chunks = s.stream("/v1/chat/completions", body(99, true)).await;
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    meets_person_schema(&streamed).unwrap_or_else(|e| panic!("streamed: {e}"));
    let v = s
        .ok(
            "/v1/completions",
            json!({"prompt": "A JSON object describing a cat:", "max_tokens": 64,
                "temperature": 0.8, "seed": 3, "response_format": {"type": "json_object"}}),
        )
        .await;
    if v["choices"][0]["finish_reason"] == "stop" {
        let text = v["choices"][0]["text"].as_str().expect("text");
        let parsed: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(parsed.is_object(), "{text:?}");
    } else {
        // Cut by max_tokens: still the start of an object, never prose.
        let text = v["choices"][0]["text"].as_str().expect("text");
        assert!(text.starts_with('{'), "{text:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_choices_and_regexes_are_met_by_every_sampled_answer() {
    let s = suite(REAL).await;
    let messages = json!([{"role": "user", "content":
        "Is the sky green? Answer, then give a ticket number like AB-123."}]);
    let choices = ["Yes", "No", "Not sure (ask again)"];
    let body = |seed: u64, extra: Value| {
        with(
            &json!({"messages": messages, "max_tokens": 24, "temperature": 1.0, "seed": seed}),
            extra,
        )
    };
    let forms = [
        json!({"structured_outputs": {"choice": choices}}),
        json!({"guided_choice": choices}),
        json!({"structured_outputs": {"regex": "[A-Z]{2}-[0-9]{3}"}}),
    ];
    for form in &forms {
        let answers: Vec<(u16, Value)> = futures::stream::iter(0..8)
            .map(|seed| s.post("/v1/chat/completions", body(seed, form.clone())))
            .buffered(4)
            .collect()
            .await;
        for (seed, (status, v)) in answers.iter().enumerate() {
            assert_eq!(*status, 200, "{form} seed {seed}: {v}");
            let choice = &v["choices"][0];
            assert_eq!(choice["finish_reason"], "stop", "{form} seed {seed}: {v}");
            let text = choice["message"]["content"].as_str().expect("content");
            let ok = if form.to_string().contains("regex") {
                let b = text.as_bytes();
                b.len() == 6
                    && b[..2].iter().all(u8::is_ascii_uppercase)
                    && b[2] == b'-'
                    && b[3..].iter().all(u8::is_ascii_digit)
            } else {
                choices.contains(&text)
            };
            assert!(ok, "{form} seed {seed}: {text:?}");
        }
    }
    // The control: unconstrained, the answer is none of the choices.
    let (_, v) = s.post("/v1/chat/completions", body(0, json!({}))).await;
    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
    assert!(!choices.contains(&text), "{text:?}");
}
