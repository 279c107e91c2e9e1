//! The path shared by both generation endpoints, from validated tokens to an HTTP response:
//! admission against the effective context (I3), dispatch of the request's choices
//! ([`Choices`]: `n` of them, each its own seed), then one JSON body or an SSE stream.

use std::time::Instant;

use axum::response::{IntoResponse, Response};
use axum::Json;
use pagewarden_common::namespace::Namespace;
use pagewarden_common::tenants::Rate;
use pagewarden_common::vllm_metrics::{FinishedRequest, RunningTimes};
use pagewarden_common::{RequestId, TenantId};
use pagewarden_proto::v1::Logprobs;
use serde_json::Value;

use crate::admission::admit;
use pagewarden_model::FinishReason;

use crate::choices::{ChoiceEvent, Choices};
use crate::disagg::Summary;
use crate::dispatch::{Job, Token};
use crate::error::RouterError;
use crate::logprobs::LogprobsRenderer;
use crate::metrics::Outcome;
use crate::openai::{Endpoint, ResponseMeta, Usage};
use crate::record::{Record, Slot};
use crate::sample::{RecomputeSample, ResponseSample};
use crate::server::AppState;
use crate::sse;
use crate::token_rate::TokenMeter;
use crate::tools::{ToolReader, ToolRequest};
use crate::validation::ValidCommon;

/// A request that passed auth, parsing and tokenization.
pub struct Prepared {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// Who asked.
    pub tenant: TenantId,
    /// The prompts' tokens (one prompt, or a completions batch; none empty).
    pub prompts: Vec<Vec<u32>>,
    /// Parameters.
    pub common: ValidCommon,
    /// Arrival time.
    pub arrived: Instant,
    /// The concurrency slot, held until the response ends.
    pub slot: Slot,
    /// The tools the model may call (chat); each choice's reply is read for calls.
    pub tools: Option<ToolRequest>,
    /// `echo` (completions): the prompt comes back before each choice's completion.
    pub echo: Option<Echo>,
    /// The client asked for a signed isolation receipt (`X-Pagewarden-Receipt: 1`).
    pub receipt: bool,
}

/// A completions request's `echo`.
#[derive(Clone, Debug)]
pub struct Echo {
    /// Each prompt as it comes back (the client's text, or its ids decoded).
    pub texts: Vec<String>,
    /// `max_tokens` was not 0: the completion follows the prompt. With 0 the request runs
    /// one token for the workers' sake and answers none of it (`finish_reason: "length"`).
    pub generate: bool,
}

/// Admits, dispatches and answers. Errors before the first token become an error status; errors
/// after it (streaming) become an error event.
pub async fn respond(state: &AppState, p: Prepared, mut record: Record) -> Response {
    let stream = p.common.stream;
    let mut s = match start(state, p) {
        Ok(s) => s,
        Err(e) => {
            record.fail(&e);
            return e.into_response();
        }
    };
    if stream {
        return sse::response(s, record);
    }
    let answers = match collect(&mut s).await {
        Ok(answers) => answers,
        Err(e) => {
            record.fail(&e);
            return e.into_response();
        }
    };
    for prompt in 0..s.prompts.len() {
        prompt_finished(&s, prompt);
    }
    let usage = s.usage();
    let mut choices = Vec::with_capacity(s.outs.len());
    for (out, shown) in s.outs.iter_mut().zip(answers) {
        let mut finish = out.finish.unwrap_or(FinishReason::Abort);
        let (mut content, calls) = (shown.text, shown.calls);
        if s.echo.as_ref().is_some_and(|e| !e.generate) {
            // Nothing generated is answered: the prompt alone, cut at its end.
            content.clear();
            out.pending.clear();
            finish = FinishReason::Length;
        }
        record.set(outcome_of_finish(finish));
        if let Some(summary) = &out.summary {
            finished(&s.state, summary, &s.meta, &out.text, finish);
        }
        let items = std::mem::take(&mut out.pending);
        let (content, logprobs) = match &s.echo {
            Some(echo) => {
                let prompt_items = std::mem::take(&mut out.prompt_logprobs);
                let logprobs = match &mut out.logprobs {
                    Some(r) => r.render_echo(
                        s.state.frontend.tokenizer(),
                        &s.prompts[out.prompt],
                        &prompt_items,
                        &items,
                    ),
                    None => Value::Null,
                };
                (format!("{}{content}", echo.texts[out.prompt]), logprobs)
            }
            None => (content, out.render_logprobs(&s.state, &items)),
        };
        choices.push(s.meta.choice(out.index, &content, &calls, finish, logprobs));
    }
    let mut body = s.meta.full(choices, usage);
    match s.receipt() {
        Ok(Some(receipt)) => body["pagewarden_receipt"] = receipt,
        Ok(None) => {}
        Err(e) => {
            record.fail(&e);
            return e.into_response();
        }
    }
    Json(body).into_response()
}

/// What one choice has produced, and how its tokens are read.
pub struct ChoiceOut {
    /// The choice's index.
    pub index: usize,
    /// Which of the request's prompts it completes.
    pub prompt: usize,
    /// Its text so far, as generated (before tool calls are read out of it).
    pub text: String,
    /// How it ended, once it has.
    pub finish: Option<FinishReason>,
    /// Logprobs of tokens not rendered yet.
    pub pending: Vec<Logprobs>,
    /// Logprobs of the prompt's tokens after the first (`echo` with `logprobs`).
    pub prompt_logprobs: Vec<Logprobs>,
    /// Renders token logprobs, when the request asked for them.
    logprobs: Option<LogprobsRenderer>,
    /// Reads the reply for tool calls.
    pub tools: Option<ToolReader>,
    /// Its account, once it ended (usage and timings).
    pub summary: Option<Summary>,
    /// No chunk of it was sent yet (a stream's first chunk carries the role).
    pub first: bool,
}

/// What a choice's tokens make visible to the client.
#[derive(Debug, Default)]
pub struct Shown {
    /// Text to show (with tools, never what may still be a call).
    pub text: String,
    /// How the choice ended, when this token ended it (`tool_calls` when read as calls).
    pub finish: Option<FinishReason>,
    /// The calls the reply made, at its end.
    pub calls: Vec<Value>,
}

impl ChoiceOut {
    /// Takes the choice's next token: its logprobs wait for rendering, and what it makes
    /// visible comes back. The one reading of a token, for whole answers and for streams.
    pub fn accept(&mut self, token: Token) -> Shown {
        self.pending.extend(token.logprobs);
        self.prompt_logprobs.extend(token.prompt_logprobs);
        self.text.push_str(&token.text);
        let mut shown = Shown {
            text: match self.tools.as_mut() {
                Some(reader) => reader.push(&token.text),
                None => token.text,
            },
            finish: token.finish,
            calls: Vec::new(),
        };
        if let (Some(f), Some(reader)) = (token.finish, self.tools.as_mut()) {
            let (end, f) = reader.finish(f);
            shown.text.push_str(&end.text);
            shown.calls = end.calls;
            shown.finish = Some(f);
        }
        if shown.finish.is_some() {
            self.finish = shown.finish;
        }
        shown
    }

    /// The `logprobs` value of a chunk or choice holding the tokens of `items`; null when the
    /// request asked for none.
    pub fn render_logprobs(&mut self, state: &AppState, items: &[Logprobs]) -> Value {
        match &mut self.logprobs {
            Some(r) => r.render(state.frontend.tokenizer(), items),
            None => Value::Null,
        }
    }
}

/// A dispatched request, answered as it goes.
pub struct Streaming {
    /// Its choices in flight.
    pub choices: Choices,
    /// What each choice has produced, by index.
    pub outs: Vec<ChoiceOut>,
    /// Shared body fields.
    pub meta: ResponseMeta,
    /// Send a usage chunk at the end.
    pub include_usage: bool,
    /// Prompt tokens (each prompt counted once, whatever `n`).
    pub prompt_tokens: u32,
    /// The prompts' ids (an echo's logprobs name them).
    pub prompts: Vec<Vec<u32>>,
    /// `echo` (completions).
    pub echo: Option<Echo>,
    /// Who asked.
    pub tenant: TenantId,
    /// The tenant's prefix-cache namespace (what a receipt names; a request scoring its
    /// prompt reads and fills no cache under it).
    pub namespace: Namespace,
    /// Attach a signed isolation receipt at the end.
    pub receipt: bool,
    /// The app (for the sample sink).
    pub state: AppState,
    /// Held until the stream ends.
    pub slot: Slot,
}

impl Streaming {
    /// The response's `usage`: each prompt once (and what of it its first choice took from the
    /// prefix cache), the completion tokens of every choice.
    pub fn usage(&self) -> Usage {
        let ended = self.outs.iter().filter_map(|o| o.summary.as_ref());
        let completion = match &self.echo {
            // The one token run for the workers' sake is not answered, nor counted.
            Some(e) if !e.generate => 0,
            _ => ended.map(|s| s.completion_tokens).sum(),
        };
        // Each prompt's first choice is the one that may have found its prompt cached.
        let n = self.outs.len() / self.prompts.len().max(1);
        let cached = self
            .outs
            .iter()
            .step_by(n.max(1))
            .filter_map(|o| o.summary.as_ref())
            .map(|s| s.cached_tokens)
            .sum();
        Usage::new(self.prompt_tokens, completion, cached)
    }

    /// The signed isolation receipt, once every choice has ended, when the request asked for
    /// one.
    pub fn receipt(&self) -> Result<Option<Value>, RouterError> {
        match (&self.state.receipts, self.receipt) {
            (Some(r), true) => r.issue(self).map(Some),
            (None, true) => Err(RouterError::ReceiptsNotConfigured),
            (_, false) => Ok(None),
        }
    }
}

fn start(state: &AppState, p: Prepared) -> Result<Streaming, RouterError> {
    let limits = state.tenants.limits(&p.tenant);
    let receipt = p.receipt || limits.receipts;
    if receipt && state.receipts.is_none() {
        return Err(RouterError::ReceiptsNotConfigured);
    }
    let context = state.disagg.effective_context()?;
    let admitted = p
        .prompts
        .into_iter()
        .map(|tokens| {
            admit(
                tokens,
                p.common.max_tokens,
                context,
                p.endpoint.prompt_param(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let prompt_tokens: usize = admitted.iter().map(|a| a.prompt.len()).sum();
    state.token_rates.admit(
        &p.tenant,
        limits.tokens_per_minute,
        prompt_tokens,
        Instant::now(),
    )?;
    let meter = TokenMeter::new(
        state.token_rates.clone(),
        p.tenant.clone(),
        limits.tokens_per_minute,
    );
    let namespace = state.tenants.namespace(&p.tenant);
    // The share of this tenant's choices the recompute audit scores (its entry's, else the
    // router's), when the sink takes them.
    let recompute_rate = match state.sink.takes_recomputes() {
        true => limits
            .recompute_rate
            .unwrap_or(state.settings.recompute_rate),
        false => Rate::ZERO,
    };
    let n = p.common.n as usize;
    let prompts: Vec<Vec<u32>> = admitted.iter().map(|a| a.prompt.clone()).collect();
    // Choice `index` (of prompt `index / n`) samples with `seed + index`.
    let groups: Vec<Vec<Job>> = admitted
        .iter()
        .enumerate()
        .map(|(k, a)| {
            (0..n)
                .map(|i| {
                    let mut sampling = p.common.sampling.clone();
                    sampling.max_tokens = a.max_tokens as usize;
                    sampling.seed = sampling.seed.map(|s| s.wrapping_add((k * n + i) as u64));
                    Job {
                        id: RequestId::random(),
                        tenant: p.tenant.clone(),
                        admitted: a.clone(),
                        sampling,
                        arrived: p.arrived,
                        weight: limits.weight,
                        namespace,
                        meter: meter.clone(),
                        recompute: recompute_rate.picks(rand::random::<f64>()),
                    }
                })
                .collect()
        })
        .collect();
    let first_id = groups
        .first()
        .and_then(|g| g.first())
        .map(|j| j.id)
        .ok_or_else(|| RouterError::Internal("a request without prompts".into()))?;
    let choices = Choices::start(state.disagg.clone(), groups)?;
    let format = state.frontend.tool_call_format();
    let outs = (0..prompts.len() * n)
        .map(|index| ChoiceOut {
            index,
            prompt: index / n,
            text: String::new(),
            finish: None,
            pending: Vec::new(),
            prompt_logprobs: Vec::new(),
            logprobs: p
                .common
                .sampling
                .logprobs
                .map(|_| LogprobsRenderer::new(p.endpoint)),
            tools: p.tools.as_ref().and_then(|t| t.reader(format)),
            summary: None,
            first: true,
        })
        .collect();
    Ok(Streaming {
        choices,
        outs,
        meta: ResponseMeta::new(
            p.endpoint,
            &first_id.to_string(),
            state.frontend.model_name(),
        ),
        include_usage: p.common.include_usage,
        prompt_tokens: prompt_tokens as u32,
        prompts,
        echo: p.echo,
        tenant: p.tenant,
        namespace,
        receipt,
        state: state.clone(),
        slot: p.slot,
    })
}

/// Every choice whole: what each shows (by index), with finish reasons and logprobs gathered
/// into `s.outs`.
async fn collect(s: &mut Streaming) -> Result<Vec<Shown>, RouterError> {
    let mut answers: Vec<Shown> = s.outs.iter().map(|_| Shown::default()).collect();
    while let Some((i, event)) = s.choices.next().await {
        match event {
            ChoiceEvent::Token(token) => {
                let shown = s.outs[i].accept(token);
                answers[i].text.push_str(&shown.text);
                answers[i].calls.extend(shown.calls);
            }
            ChoiceEvent::Ended(summary) => s.outs[i].summary = Some(*summary),
            ChoiceEvent::Failed(e) => return Err(e),
        }
    }
    Ok(answers)
}

/// vLLM's phases of a choice that ran to a first token: prefill from decode's grant to the
/// first token, decode from there to the last.
fn running_times(summary: &Summary) -> Option<RunningTimes> {
    let (scheduled, first, last) = (summary.scheduled?, summary.ttft?, summary.last_token?);
    Some(RunningTimes {
        prefill_seconds: first.saturating_sub(scheduled).as_secs_f64(),
        decode_seconds: last.saturating_sub(first).as_secs_f64(),
    })
}

/// Once every choice of prompt `prompt` has ended: counts the most tokens one of them
/// generated (vLLM's `request_max_num_generation_tokens`, observed once per request).
pub fn prompt_finished(s: &Streaming, prompt: usize) {
    let ended: Option<Vec<&Summary>> = s
        .outs
        .iter()
        .filter(|o| o.prompt == prompt)
        .map(|o| o.summary.as_ref())
        .collect();
    let Some(most) = ended.and_then(|e| e.iter().map(|x| x.completion_tokens).max()) else {
        return;
    };
    s.state.metrics.vllm.request_finished(u64::from(most));
}

/// `completed` for stop/length/tool calls, `aborted` when a worker aborted.
pub fn outcome_of_finish(finish: FinishReason) -> Outcome {
    match finish {
        FinishReason::Stop | FinishReason::Length | FinishReason::ToolCalls => Outcome::Completed,
        FinishReason::Abort => Outcome::Aborted,
    }
}

/// The recompute audit's sample of a choice picked for it that ran to its end (an aborted one
/// is not scored: its tokens may stop anywhere) with every token's served logprob.
fn recompute_sample(summary: &Summary, finish: FinishReason) -> Option<RecomputeSample> {
    let p = &summary.provenance;
    let r = p.recompute.as_ref()?;
    if finish == FinishReason::Abort || r.served.len() != p.output_ids.len() {
        return None;
    }
    Some(RecomputeSample {
        request: summary.id,
        tenant: summary.tenant.clone(),
        prompt: r.prompt.clone(),
        output: p.output_ids.clone(),
        served_logprobs: r.served.clone(),
        temperature: r.temperature,
        prefill_node: p.prefill_worker.clone(),
        decode_node: p.decode_worker.clone(),
        pages: p
            .account
            .as_ref()
            .map(|a| a.pages.iter().map(|g| (g.page, g.generation)).collect())
            .unwrap_or_default(),
        cached_tokens: summary.cached_tokens,
        arithmetic: p.arithmetic.clone(),
    })
}

/// A choice that finished (stop, length, tool calls, or abort by a worker): counted under
/// vLLM's metrics and offered to the sample sink.
pub fn finished(
    state: &AppState,
    summary: &Summary,
    meta: &ResponseMeta,
    text: &str,
    finish: FinishReason,
) {
    state.metrics.vllm.finished(FinishedRequest {
        prompt_tokens: u64::from(summary.prompt_tokens),
        generation_tokens: u64::from(summary.completion_tokens),
        e2e_seconds: summary.arrived.elapsed().as_secs_f64(),
        running: running_times(summary),
        finished_reason: finish.as_str(),
    });
    if let Some(r) = recompute_sample(summary, finish) {
        state.sink.recompute(r);
    }
    state.sink.offer(ResponseSample {
        request: summary.id,
        tenant: summary.tenant.clone(),
        endpoint: meta.endpoint.as_str(),
        prompt_tokens: summary.prompt_tokens,
        completion_tokens: summary.completion_tokens,
        text: text.to_string(),
        finish_reason: finish.as_str(),
        ttft: summary.ttft,
    });
}
