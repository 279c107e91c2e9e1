//! The HTTP handlers: thin, each turning its input into `Valid*` types and handing over to
//! `respond`. Every error leaves through `RouterError`'s one mapping.

use std::time::Instant;

use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagewarden_common::TenantId;
use serde_json::json;

use crate::error::{Half, RouterError, RETRY_AFTER_SECS};
use crate::extract::JsonObject;
use crate::openai::{model_list, model_object, Endpoint};
use crate::receipt;
use crate::record::{Limits, Record, Slot};
use crate::respond::{respond, Echo, Prepared};
use crate::server::AppState;
use crate::validation::{Prompt, ValidChatRequest, ValidCompletionRequest};

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    Extension(tenant): Extension<TenantId>,
    headers: HeaderMap,
    body: Result<JsonObject, RouterError>,
) -> Response {
    let arrived = Instant::now();
    let mut record = Record::new(Endpoint::Completions, state.metrics.clone());
    let prepared = async {
        let slot = state.slot(&tenant)?;
        let receipt = receipt::requested(&headers)?;
        let req = ValidCompletionRequest::parse(&body?.0)?;
        check_model(&state, req.common.model.as_deref())?;
        state
            .frontend
            .check_logit_bias(&req.common.sampling.logit_bias)?;
        let frontend = state.frontend.clone();
        let prompts = req.prompts;
        let mut common = req.common;
        let grammar = common.sampling.grammar.clone().zip(common.grammar_field);
        let (prompts, texts) = blocking(move || {
            frontend.check_grammar(grammar.as_ref())?;
            let tokens = prompts
                .iter()
                .map(|p| frontend.completion_tokens(p))
                .collect::<Result<Vec<_>, _>>()?;
            let texts: Vec<String> = prompts
                .iter()
                .map(|p| match p {
                    Prompt::Text(text) => text.clone(),
                    Prompt::Tokens(ids) => frontend.tokenizer().decode(ids),
                })
                .collect();
            Ok((tokens, texts))
        })
        .await?;
        let echo = req.echo.then(|| {
            let generate = common.max_tokens != Some(0);
            if !generate {
                // The workers always generate: one token, run and not answered.
                common.max_tokens = Some(1);
            }
            Echo { texts, generate }
        });
        Ok::<_, RouterError>(Prepared {
            endpoint: Endpoint::Completions,
            tenant,
            prompts,
            common,
            arrived,
            slot,
            tools: None,
            echo,
            receipt,
        })
    };
    match prepared.await {
        Ok(p) => respond(&state, p, record).await,
        Err(e) => {
            record.fail(&e);
            e.into_response()
        }
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(state): State<AppState>,
    Extension(tenant): Extension<TenantId>,
    headers: HeaderMap,
    body: Result<JsonObject, RouterError>,
) -> Response {
    let arrived = Instant::now();
    let mut record = Record::new(Endpoint::Chat, state.metrics.clone());
    let prepared = async {
        let slot = state.slot(&tenant)?;
        let receipt = receipt::requested(&headers)?;
        let req = ValidChatRequest::parse(&body?.0)?;
        check_model(&state, req.common.model.as_deref())?;
        state
            .frontend
            .check_logit_bias(&req.common.sampling.logit_bias)?;
        let frontend = state.frontend.clone();
        let messages = req.messages;
        let grammar = req
            .common
            .sampling
            .grammar
            .clone()
            .zip(req.common.grammar_field);
        let tools = req.tools;
        let definitions = tools.as_ref().map(|t| t.tools.clone()).unwrap_or_default();
        let tokens = blocking(move || {
            frontend.check_grammar(grammar.as_ref())?;
            frontend.chat_tokens(&messages, &definitions)
        })
        .await?;
        Ok::<_, RouterError>(Prepared {
            endpoint: Endpoint::Chat,
            tenant,
            prompts: vec![tokens],
            common: req.common,
            arrived,
            slot,
            tools,
            echo: None,
            receipt,
        })
    };
    match prepared.await {
        Ok(p) => respond(&state, p, record).await,
        Err(e) => {
            record.fail(&e);
            e.into_response()
        }
    }
}

/// Tokenizing a long prompt is CPU work: keep it off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RouterError> + Send + 'static,
) -> Result<T, RouterError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RouterError::Internal(format!("tokenizer task failed: {e}")))?
}

pub(crate) fn check_model(state: &AppState, model: Option<&str>) -> Result<(), RouterError> {
    match model {
        Some(m) if m != state.frontend.model_name() => Err(RouterError::ModelNotFound(m.into())),
        Some(_) | None => Ok(()),
    }
}

/// `GET /v1/models`.
pub async fn models(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(model_list(
        state.frontend.model_name(),
        state.pool.effective_context().ok(),
    ))
}

/// `GET /v1/models/{id}`: the served model, or 404 `model_not_found` for any other id.
pub async fn model(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, RouterError> {
    let name = state.frontend.model_name();
    if id != name {
        return Err(RouterError::ModelNotFound(id));
    }
    Ok(Json(model_object(
        name,
        state.pool.effective_context().ok(),
    )))
}

/// `/v1/embeddings`: an API this deployment does not serve, said as such.
pub async fn embeddings() -> RouterError {
    RouterError::ApiNotServed("embeddings")
}

/// `/v1/responses`: an API this deployment does not serve, said as such.
pub async fn responses() -> RouterError {
    RouterError::ApiNotServed("Responses")
}

/// `GET /live`: 200 while the process serves HTTP, whatever the workers' state (liveness: a
/// restart would not help a router whose workers are down).
pub async fn live() -> &'static str {
    "ok"
}

/// `GET /health` and `GET /ready`: 200 when at least one decode and one prefill worker are
/// live, else 503 (readiness: send no traffic here until then). The body also lists every
/// worker (`workers`: role, node id, liveness, load, device, version; no addresses).
pub async fn health(State(state): State<AppState>) -> Response {
    let context = state.pool.effective_context();
    let body = json!({
        "status": if context.is_ok() { "ok" } else { "unavailable" },
        "live_decode": state.pool.live_count(Half::Decode),
        "live_prefill": state.pool.live_count(Half::Prefill),
        "effective_context": context.as_ref().ok(),
        "workers": state.pool.statuses(),
    });
    match context {
        Ok(_) => (StatusCode::OK, Json(body)).into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, RETRY_AFTER_SECS.to_string())],
            Json(body),
        )
            .into_response(),
    }
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

/// Unknown routes: an OpenAI-shaped 404.
pub async fn not_found(uri: axum::http::Uri) -> RouterError {
    RouterError::NotFound(uri.path().to_string())
}

impl AppState {
    /// A slot under the router's limit and `tenant`'s own (its entry's `max_concurrent`, else
    /// `--tenant-max-concurrency`, else none).
    fn slot(&self, tenant: &TenantId) -> Result<Slot, RouterError> {
        let tenant_limit = self
            .tenants
            .max_concurrent(tenant)
            .map(|n| n as usize)
            .or(self.settings.tenant_max_concurrency);
        let limits = Limits {
            router: (&self.limiter, self.settings.max_concurrency),
            tenant: (&self.tenant_slots, tenant, tenant_limit),
        };
        Slot::acquire(limits, &self.metrics)
    }
}
