//! The path shared by both generation endpoints, from validated tokens to an HTTP response:
//! admission against the effective context (I3), dispatch, then one JSON body or an SSE stream.

use std::time::Instant;

use axum::response::{IntoResponse, Response};
use axum::Json;
use pagewarden_common::vllm_metrics::FinishedRequest;
use pagewarden_common::{RequestId, TenantId};
use pagewarden_proto::v1::Logprobs;
use serde_json::Value;

use crate::admission::admit;
use pagewarden_model::FinishReason;

use crate::dispatch::{Flight, Job, Token};
use crate::error::RouterError;
use crate::logprobs::LogprobsRenderer;
use crate::metrics::Outcome;
use crate::openai::{Endpoint, ResponseMeta};
use crate::record::{Record, Slot};
use crate::sample::ResponseSample;
use crate::server::AppState;
use crate::sse;
use crate::token_rate::TokenMeter;
use crate::tools::ToolReader;
use crate::validation::ValidCommon;

/// A request that passed auth, parsing and tokenization.
pub struct Prepared {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// Who asked.
    pub tenant: TenantId,
    /// The prompt's tokens.
    pub tokens: Vec<u32>,
    /// Parameters.
    pub common: ValidCommon,
    /// Arrival time.
    pub arrived: Instant,
    /// The concurrency slot, held until the response ends.
    pub slot: Slot,
    /// Reads the reply for tool calls (chat with tools the model may call).
    pub tools: Option<ToolReader>,
}

/// Admits, dispatches and answers. Errors before the first token become an error status; errors
/// after it (streaming) become an error event.
pub async fn respond(state: &AppState, p: Prepared, mut record: Record) -> Response {
    match start(state, p).await {
        Ok(Started::Stream(s)) => sse::response(s, record),
        Ok(Started::Full(mut s)) => match collect(&mut s).await {
            Ok((text, finish, logprobs)) => {
                let usage = s.flight.usage();
                let (content, finish, calls) = match s.tools.as_mut() {
                    Some(reader) => {
                        let released = reader.push(&text);
                        let (end, finish) = reader.finish(finish);
                        (released + &end.text, finish, end.calls)
                    }
                    None => (text.clone(), finish, Vec::new()),
                };
                record.set(outcome_of_finish(finish));
                finished(state, &s, &text, finish);
                let logprobs = s.render_logprobs(&logprobs);
                Json(s.meta.full(&content, &calls, finish, usage, logprobs)).into_response()
            }
            Err(e) => {
                record.fail(&e);
                e.into_response()
            }
        },
        Err(e) => {
            record.fail(&e);
            e.into_response()
        }
    }
}

/// A dispatched request, answered as it goes.
pub struct Streaming {
    /// The dispatched request.
    pub flight: Flight,
    /// Its first token, not yet sent (a full answer waits for it before anything is sent; a
    /// stream starts before it).
    pub first: Option<Token>,
    /// Shared body fields.
    pub meta: ResponseMeta,
    /// Send a usage chunk at the end.
    pub include_usage: bool,
    /// Renders token logprobs, when the request asked for them.
    pub logprobs: Option<LogprobsRenderer>,
    /// The app (for the sample sink).
    pub state: AppState,
    /// Held until the stream ends.
    pub slot: Slot,
    /// Reads the reply for tool calls.
    pub tools: Option<ToolReader>,
}

impl Streaming {
    /// The `logprobs` value of a choice holding the tokens of `items`; null when the request
    /// asked for none.
    pub fn render_logprobs(&mut self, items: &[Logprobs]) -> Value {
        match &mut self.logprobs {
            Some(r) => r.render(self.state.frontend.tokenizer(), items),
            None => Value::Null,
        }
    }
}

enum Started {
    Stream(Streaming),
    Full(Streaming),
}

async fn start(state: &AppState, p: Prepared) -> Result<Started, RouterError> {
    let context = state.pool.effective_context()?;
    let logprobs = p
        .common
        .sampling
        .logprobs
        .map(|_| LogprobsRenderer::new(p.endpoint));
    let admitted = admit(
        p.tokens,
        p.common.max_tokens,
        context,
        p.endpoint.prompt_param(),
    )?;
    let limits = state.tenants.limits(&p.tenant);
    state.token_rates.admit(
        &p.tenant,
        limits.tokens_per_minute,
        admitted.prompt.len(),
        Instant::now(),
    )?;
    let meter = TokenMeter::new(
        state.token_rates.clone(),
        p.tenant.clone(),
        limits.tokens_per_minute,
    );
    let namespace = state.tenants.namespace(&p.tenant);
    let job = Job {
        id: RequestId::random(),
        tenant: p.tenant,
        admitted,
        sampling: p.common.sampling,
        arrived: p.arrived,
        weight: limits.weight,
        namespace,
        meter,
    };
    let mut flight = Flight::start(
        &state.pool,
        state.settings.dispatch,
        state.metrics.clone(),
        job,
    )?;
    let meta = ResponseMeta::new(
        p.endpoint,
        &flight.id().to_string(),
        state.frontend.model_name(),
    );
    if p.common.stream {
        // Headers and the first chunk go out now; queueing and prefill happen inside the
        // stream (keep-alive comments meanwhile), and a worker failure there becomes an
        // error event.
        return Ok(Started::Stream(Streaming {
            flight,
            first: None,
            meta,
            include_usage: p.common.include_usage,
            logprobs,
            state: state.clone(),
            slot: p.slot,
            tools: p.tools,
        }));
    }
    let first = match flight.next().await {
        Some(Ok(token)) => token,
        Some(Err(e)) => return Err(e),
        None => {
            return Err(RouterError::Internal(
                "request ended before any token".into(),
            ))
        }
    };
    Ok(Started::Full(Streaming {
        flight,
        first: Some(first),
        meta,
        include_usage: p.common.include_usage,
        logprobs,
        state: state.clone(),
        slot: p.slot,
        tools: p.tools,
    }))
}

/// The whole completion: its text, how it ended, and its tokens' logprobs (when requested).
async fn collect(s: &mut Streaming) -> Result<(String, FinishReason, Vec<Logprobs>), RouterError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    let mut next = s.first.take();
    loop {
        let token = match next.take() {
            Some(first) => first,
            None => match s.flight.next().await {
                Some(Ok(token)) => token,
                Some(Err(e)) => return Err(e),
                None => return Err(RouterError::Internal("token stream ended early".into())),
            },
        };
        text.push_str(&token.text);
        logprobs.extend(token.logprobs);
        if let Some(finish) = token.finish {
            return Ok((text, finish, logprobs));
        }
    }
}

/// `completed` for stop/length, `aborted` when a worker aborted.
pub fn outcome_of_finish(finish: FinishReason) -> Outcome {
    match finish {
        FinishReason::Stop | FinishReason::Length | FinishReason::ToolCalls => Outcome::Completed,
        FinishReason::Abort => Outcome::Aborted,
    }
}

/// A response that finished (stop, length, or abort by a worker): counted under vLLM's metrics
/// and offered to the sample sink.
pub fn finished(state: &AppState, s: &Streaming, text: &str, finish: FinishReason) {
    state.metrics.vllm.finished(FinishedRequest {
        prompt_tokens: u64::from(s.flight.prompt_tokens()),
        generation_tokens: u64::from(s.flight.completion_tokens()),
        e2e_seconds: s.flight.arrived().elapsed().as_secs_f64(),
        finished_reason: finish.as_str(),
    });
    state.sink.offer(ResponseSample {
        request: s.flight.id(),
        tenant: s.flight.tenant().clone(),
        endpoint: s.meta.endpoint.as_str(),
        prompt_tokens: s.flight.prompt_tokens(),
        completion_tokens: s.flight.completion_tokens(),
        text: text.to_string(),
        finish_reason: finish.as_str(),
        ttft: s.flight.ttft(),
    });
}
