//! [`InMemoryDisagg`]: a [`Disagg`] without workers, for tests of the router (and of what is
//! built on it) that need no gRPC server and no model. Every choice replies with the same
//! scripted token texts, then ends with `stop`; `max_tokens` cuts it with `length`, as the
//! workers would. Every job it was given is kept for the test to read, and so is every cache
//! erasure (which erases nothing: it answers one empty part per half).

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use pagewarden_common::namespace::Namespace;
use pagewarden_common::TenantId;
use pagewarden_model::FinishReason;

use crate::disagg::{Disagg, Generation, Summary};
use crate::dispatch::{Job, Token};
use crate::erasure::WorkerErasure;
use crate::error::RouterError;
use crate::provenance::Provenance;

/// What one dispatched choice was asked, as the test reads it.
#[derive(Clone, Debug)]
pub struct SeenJob {
    /// The prompt's ids.
    pub prompt: Vec<u32>,
    /// The completion budget.
    pub max_tokens: u32,
    /// The sampling seed.
    pub seed: Option<u64>,
    /// Who asked.
    pub tenant: String,
}

/// Serves every choice from a script, in this process.
pub struct InMemoryDisagg {
    context: u32,
    reply: Vec<String>,
    seen: Arc<Mutex<Vec<SeenJob>>>,
    erased: Arc<Mutex<Vec<(TenantId, Namespace)>>>,
}

impl InMemoryDisagg {
    /// Replies `reply` (one text per token) to every choice, under an effective context of
    /// `context` tokens.
    pub fn new(context: u32, reply: &[&str]) -> Self {
        Self {
            context,
            reply: reply.iter().map(|s| s.to_string()).collect(),
            seen: Arc::default(),
            erased: Arc::default(),
        }
    }

    /// Every cache erasure asked so far: the tenant and the namespace the router derived.
    pub fn erased(&self) -> Vec<(TenantId, Namespace)> {
        self.erased
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every job dispatched so far, in order.
    pub fn seen(&self) -> Vec<SeenJob> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Disagg for InMemoryDisagg {
    fn effective_context(&self) -> Result<u32, RouterError> {
        Ok(self.context)
    }

    fn erase_cache<'a>(
        &'a self,
        tenant: &'a TenantId,
        namespace: Namespace,
    ) -> BoxFuture<'a, Result<Vec<WorkerErasure>, RouterError>> {
        self.erased
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((tenant.clone(), namespace));
        let part = |role| WorkerErasure {
            worker: format!("in-memory-{role}"),
            role,
            entries: 0,
            pages_zeroed: 0,
            pages_deferred: 0,
            digest: "00".repeat(32),
        };
        Box::pin(async move { Ok(vec![part("prefill"), part("decode")]) })
    }

    fn dispatch(&self, job: Job) -> Result<Box<dyn Generation>, RouterError> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(SeenJob {
                prompt: job.admitted.prompt.clone(),
                max_tokens: job.admitted.max_tokens,
                seed: job.sampling.seed,
                tenant: job.tenant.as_str().to_string(),
            });
        let budget = job.admitted.max_tokens as usize;
        let texts: Vec<String> = self.reply.iter().take(budget).cloned().collect();
        let finish = if self.reply.len() > budget {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        Ok(Box::new(Scripted {
            summary: Summary {
                id: job.id,
                tenant: job.tenant,
                prompt_tokens: job.admitted.prompt.len() as u32,
                cached_tokens: 0,
                completion_tokens: 0,
                arrived: job.arrived,
                ttft: None,
                scheduled: None,
                last_token: None,
                provenance: Provenance::default(),
            },
            texts: texts.into_iter(),
            finish,
            done: false,
        }))
    }
}

struct Scripted {
    summary: Summary,
    texts: std::vec::IntoIter<String>,
    finish: FinishReason,
    done: bool,
}

impl Generation for Scripted {
    fn next(&mut self) -> BoxFuture<'_, Option<Result<Token, RouterError>>> {
        Box::pin(async move {
            if self.done {
                return None;
            }
            let text = self.texts.next();
            let last = self.texts.len() == 0;
            let s = &mut self.summary;
            s.ttft.get_or_insert_with(|| s.arrived.elapsed());
            let token = match text {
                Some(text) => {
                    s.completion_tokens += 1;
                    Token {
                        id: s.completion_tokens,
                        text,
                        finish: last.then_some(self.finish),
                        logprobs: None,
                        prompt_logprobs: Vec::new(),
                    }
                }
                // An empty script: one end marker.
                None => Token {
                    id: 0,
                    text: String::new(),
                    finish: Some(self.finish),
                    logprobs: None,
                    prompt_logprobs: Vec::new(),
                },
            };
            self.done = token.finish.is_some();
            Some(Ok(token))
        })
    }

    fn summary(&self) -> Summary {
        self.summary.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{header, Request, StatusCode};
    use pagewarden_common::secret::SecretHash;
    use pagewarden_common::tenants::TenantEntry;
    use serde_json::{json, Value};
    use tower::ServiceExt;

    use super::*;
    use crate::dispatch::DispatchConfig;
    use crate::frontend::Frontend;
    use crate::server::{router, AppState, Settings};
    use crate::tenants::Tenants;
    use crate::workers::{Links, WorkerPool};
    use crate::NoSampling;

    const KEY: &str = "sk-in-memory";

    /// The router over `disagg`: the tiny test vocabulary, one tenant, no worker at all.
    fn app(disagg: Arc<InMemoryDisagg>) -> axum::Router {
        router(state(disagg))
    }

    fn state(disagg: Arc<InMemoryDisagg>) -> AppState {
        state_with(disagg, false)
    }

    /// The state with tenant `alpha`'s tenants-file `receipts` setting.
    fn state_with(disagg: Arc<InMemoryDisagg>, receipts: bool) -> AppState {
        let tenants = Tenants::new(&[TenantEntry {
            name: "alpha".into(),
            key_sha256: vec![SecretHash::of(KEY)],
            max_concurrent: None,
            weight: None,
            tokens_per_minute: None,
            shared_namespace: None,
            receipts,
            recompute_rate: None,
        }])
        .expect("tenants");
        let frontend = Frontend::tiny(7, "tiny".into()).expect("tiny vocabulary");
        let links = Links {
            connect_timeout: Duration::from_millis(100),
            keepalive: Duration::from_secs(10),
        };
        let pool = WorkerPool::new(&[], &[], links, Duration::from_millis(100)).expect("pool");
        let settings = Settings {
            max_body_bytes: 1 << 20,
            max_concurrency: 8,
            tenant_max_concurrency: None,
            dispatch: DispatchConfig {
                request_timeout: Some(Duration::from_secs(10)),
                abort_timeout: Duration::from_secs(1),
                decode_unresponsive: Duration::from_secs(10),
            },
            info_interval: Duration::from_millis(100),
            recompute_rate: pagewarden_common::tenants::Rate::ZERO,
        };
        AppState::new(settings, tenants, frontend, pool, Arc::new(NoSampling)).with_disagg(disagg)
    }

    async fn post(app: axum::Router, path: &str, body: Value) -> (StatusCode, String) {
        post_with(app, path, body, &[]).await
    }

    async fn post_with(
        app: axum::Router,
        path: &str,
        body: Value,
        headers: &[(&str, &str)],
    ) -> (StatusCode, String) {
        let mut req = Request::post(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .header(header::AUTHORIZATION, format!("Bearer {KEY}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .expect("request");
        let resp = app.oneshot(req).await.expect("response");
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, String::from_utf8(bytes.to_vec()).expect("UTF-8"))
    }

    #[tokio::test]
    async fn a_chat_request_is_served_through_the_seam_without_workers_or_a_model() {
        let disagg = Arc::new(InMemoryDisagg::new(512, &["Hel", "lo", " there"]));
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "n": 2, "seed": 9});
        let (status, text) = post(app(disagg.clone()), "/v1/chat/completions", body).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let v: Value = serde_json::from_str(&text).expect("JSON");
        for i in 0..2 {
            let c = &v["choices"][i];
            assert_eq!(c["message"]["content"], "Hello there", "{v}");
            assert_eq!(c["finish_reason"], "stop");
        }
        assert_eq!(v["usage"]["completion_tokens"], 6);
        let seen = disagg.seen();
        assert_eq!(seen.len(), 2);
        assert_eq!(
            seen.iter().map(|j| j.seed).collect::<Vec<_>>(),
            [Some(9), Some(10)]
        );
        assert_eq!(seen[0].tenant, "alpha");
        assert!(!seen[0].prompt.is_empty());

        // Streamed, the same text in deltas; max_tokens cuts it with `length`.
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true,
            "max_tokens": 2});
        let (status, text) = post(app(disagg.clone()), "/v1/chat/completions", body).await;
        assert_eq!(status, StatusCode::OK);
        let chunks: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("chunk"))
            .collect();
        let content: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "Hello");
        assert_eq!(
            chunks.last().expect("chunks")["choices"][0]["finish_reason"],
            "length"
        );
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    }

    #[tokio::test]
    async fn a_receipt_is_signed_for_every_choice_and_refused_without_a_key() {
        use pagewarden_common::receipt::{ReceiptKey, VerifyError};

        use crate::receipt::Receipts;

        let ask = [("x-pagewarden-receipt", "1")];
        let body = json!({"prompt": "hi", "n": 2, "max_tokens": 4});
        // Without a key: a 400 naming the cause, and nothing dispatched.
        let disagg = Arc::new(InMemoryDisagg::new(512, &["a", "b"]));
        let (status, text) =
            post_with(app(disagg.clone()), "/v1/completions", body.clone(), &ask).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(text.contains("receipts_not_configured"), "{text}");
        let bad = [("x-pagewarden-receipt", "yes please")];
        let (status, text) =
            post_with(app(disagg.clone()), "/v1/completions", body.clone(), &bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(text.contains("X-Pagewarden-Receipt"), "{text}");
        assert!(disagg.seen().is_empty(), "nothing was dispatched");

        let key = ReceiptKey::generate_pem().unwrap();
        let public = ReceiptKey::from_pem(&key).unwrap().public();
        let signing = || Receipts::new(ReceiptKey::from_pem(&key).unwrap());
        let with_key = router(state(disagg.clone()).with_receipts(signing()));
        let (status, text) = post_with(with_key, "/v1/completions", body.clone(), &ask).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let signed = &v["pagewarden_receipt"];
        let receipt = public.verify(signed).expect("verifies");
        assert_eq!(receipt["tenant"], "alpha");
        assert_eq!(receipt["response_id"], v["id"]);
        assert_eq!(receipt["choices"].as_array().map(Vec::len), Some(2));
        let mut tampered = signed.clone();
        tampered["receipt"]["choices"][1]["index"] = json!(0);
        assert_eq!(public.verify(&tampered), Err(VerifyError::BadSignature));

        // Streamed: the last chunk before [DONE] carries it; without the header, none.
        let stream = json!({"prompt": "hi", "max_tokens": 2, "stream": true});
        let with_key = router(state(disagg.clone()).with_receipts(signing()));
        let (_, text) = post_with(with_key, "/v1/completions", stream, &ask).await;
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        let last: Value = serde_json::from_str(data[data.len() - 2]).expect("last chunk");
        assert!(public.verify(&last["pagewarden_receipt"]).is_ok(), "{text}");
        let with_key = router(state(disagg.clone()).with_receipts(signing()));
        let (_, text) = post(with_key, "/v1/completions", body.clone()).await;
        assert!(!text.contains("pagewarden_receipt"), "{text}");

        // A tenant whose entry says `receipts = true` gets one unasked; without a key, a 400.
        let always = router(state_with(disagg.clone(), true).with_receipts(signing()));
        let (status, text) = post(always, "/v1/completions", body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(public.verify(&v["pagewarden_receipt"]).is_ok(), "{text}");
        let (status, text) = post(router(state_with(disagg, true)), "/v1/completions", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(text.contains("receipts_not_configured"), "{text}");
    }

    #[tokio::test]
    async fn a_prompt_beyond_the_seams_context_is_refused_before_dispatch() {
        let disagg = Arc::new(InMemoryDisagg::new(16, &["x"]));
        let body = json!({"prompt": "a long prompt ".repeat(20), "max_tokens": 4});
        let (status, text) = post(app(disagg.clone()), "/v1/completions", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(text.contains("context_length_exceeded"), "{text}");
        assert!(disagg.seen().is_empty(), "nothing was dispatched");
    }
}
