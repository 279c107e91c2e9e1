//! The text-side endpoints vLLM and llama-server offer beside generation: `POST /tokenize`,
//! `POST /detokenize`, `GET /tokenizer_info` (authenticated like `/v1`) and `GET /version`. They touch no worker.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use crate::error::RouterError;
use crate::extract::JsonObject;
use crate::handlers::{blocking, check_model};
use crate::server::AppState;
use crate::validation::{TokenizeInput, ValidDetokenizeRequest, ValidTokenizeRequest};

/// `POST /tokenize`: `{"prompt": …}` or `{"messages": […]}` (rendered through the chat template
/// with the assistant turn opened, exactly as `/v1/chat/completions` would) → the token ids,
/// their count and the context the suite serves.
pub async fn tokenize(
    State(state): State<AppState>,
    body: Result<JsonObject, RouterError>,
) -> Result<Json<Value>, RouterError> {
    let req = ValidTokenizeRequest::parse(&body?.0)?;
    check_model(&state, req.model.as_deref())?;
    let frontend = state.frontend.clone();
    let tokens = blocking(move || match &req.input {
        TokenizeInput::Prompt(p) => frontend.prompt_tokens(p, req.add_special_tokens),
        TokenizeInput::Messages(m) => frontend.chat_tokens(m, &[]),
    })
    .await?;
    Ok(Json(json!({
        "count": tokens.len(),
        "max_model_len": state.pool.effective_context().ok(),
        "tokens": tokens,
    })))
}

/// `POST /detokenize`: `{"tokens": [ids]}` → `{"prompt": text}`.
pub async fn detokenize(
    State(state): State<AppState>,
    body: Result<JsonObject, RouterError>,
) -> Result<Json<Value>, RouterError> {
    let req = ValidDetokenizeRequest::parse(&body?.0, state.frontend.tokenizer().vocab_size())?;
    check_model(&state, req.model.as_deref())?;
    let text = state.frontend.tokenizer().decode(&req.tokens);
    Ok(Json(json!({ "prompt": text })))
}

/// `GET /tokenizer_info` (vLLM's): the special tokens' texts, the chat template and the context,
/// which clients that tokenize through the server (lm-evaluation-harness's remote tokenizer)
/// read first.
pub async fn tokenizer_info(State(state): State<AppState>) -> Json<Value> {
    let tok = state.frontend.tokenizer();
    let text =
        |id: Option<u32>| id.map(|id| String::from_utf8_lossy(tok.token_bytes(id)).into_owned());
    Json(json!({
        "bos_token": text(tok.bos_token()),
        "eos_token": text(tok.eos_token()),
        "pad_token": null,
        "add_bos_token": tok.add_bos(),
        "chat_template": state.frontend.chat_template_source(),
        "model_max_length": state.pool.effective_context().ok(),
        "vocab_size": tok.vocab_size(),
    }))
}

/// `GET /version`: the suite's version (no authentication, as vLLM's).
pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}
