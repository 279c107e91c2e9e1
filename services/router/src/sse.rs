//! The streaming response: OpenAI chunks as server-sent events, an optional usage chunk, then
//! `data: [DONE]`. Headers and a first chunk per choice (chat: the assistant role, empty
//! content; completions: empty text) go out as soon as the request is admitted, before any
//! worker is called, so a client sees progress while the request waits in a queue or its prompt
//! runs (keep-alive comments meanwhile). Chunks of several choices (`n`) interleave as their
//! tokens arrive, each with its `index`. A worker failure after that becomes an
//! `{"error": …}` event. The stream owns the [`Choices`](crate::choices::Choices); a client that
//! disconnects drops them, which aborts both halves of every choice.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, Stream, StreamExt};

use crate::choices::ChoiceEvent;
use crate::dispatch::Token;

use crate::record::Record;
use crate::respond::{finished, outcome_of_finish, prompt_finished, Shown, Streaming};

struct State {
    s: Streaming,
    record: Record,
    queue: VecDeque<Event>,
    done: bool,
}

impl State {
    fn push(&mut self, index: usize, token: Token) {
        let out = &mut self.s.outs[index];
        let Shown {
            text,
            finish,
            calls,
        } = out.accept(token);
        // Nothing to show (mid-UTF-8, or text held back for a possible stop sequence).
        if text.is_empty() && finish.is_none() && !out.first {
            return;
        }
        let pending = std::mem::take(&mut out.pending);
        let logprobs = if pending.is_empty() {
            serde_json::Value::Null
        } else {
            out.render_logprobs(&self.s.state, &pending)
        };
        let meta = &self.s.meta;
        if calls.is_empty() {
            let chunk = meta.chunk(index, &text, finish, out.first, logprobs);
            self.queue.push_back(json_event(&chunk));
        } else {
            // Text before the calls, the calls, then the end.
            if !text.is_empty() || out.first {
                let chunk = meta.chunk(index, &text, None, out.first, logprobs);
                self.queue.push_back(json_event(&chunk));
            }
            self.queue
                .push_back(json_event(&meta.tool_calls_chunk(index, &calls)));
            let chunk = meta.chunk(index, "", finish, false, serde_json::Value::Null);
            self.queue.push_back(json_event(&chunk));
        }
        out.first = false;
        if let Some(finish) = finish {
            self.record.set(outcome_of_finish(finish));
        }
    }

    /// Choice `index` ended: it is counted and sampled; after the last one, the usage chunk.
    fn ended(&mut self, index: usize, summary: crate::disagg::Summary) {
        let out = &mut self.s.outs[index];
        let finish = out.finish.unwrap_or(pagewarden_model::FinishReason::Abort);
        finished(&self.s.state, &summary, &self.s.meta, &out.text, finish);
        out.summary = Some(summary);
        let prompt = out.prompt;
        prompt_finished(&self.s, prompt);
        if self.s.outs.iter().all(|o| o.summary.is_some()) {
            if self.s.include_usage {
                let usage = self.s.usage();
                self.queue
                    .push_back(json_event(&self.s.meta.usage_chunk(usage)));
            }
            match self.s.receipt() {
                Ok(Some(receipt)) => {
                    let chunk = self.s.meta.receipt_chunk(receipt);
                    self.queue.push_back(json_event(&chunk));
                }
                Ok(None) => {}
                Err(e) => return self.fail(&e),
            }
            self.finish();
        }
    }

    fn fail(&mut self, e: &crate::error::RouterError) {
        self.record.fail(e);
        self.queue
            .push_back(json_event(&serde_json::json!(e.body())));
        self.finish();
    }

    fn finish(&mut self) {
        self.queue.push_back(Event::default().data("[DONE]"));
        self.done = true;
    }
}

fn json_event(v: &serde_json::Value) -> Event {
    Event::default().data(v.to_string())
}

/// Between two events of a stream (e.g. during a long prefill), a comment line this often.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// Events buffered between the request and a slow reader.
const SSE_BUFFER: usize = 64;

/// How long a client may leave the buffer full (not reading) before its request is dropped,
/// which frees its concurrency slot and aborts both halves.
pub const SSE_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Turns a started request into an SSE response. A task pumps the events into a bounded
/// buffer; a client that stops reading for [`SSE_WRITE_TIMEOUT`] (or disconnects) ends the
/// task, and with it the request: hyper never polls the body of a client that does not read,
/// so the bound has to live outside it.
pub fn response(s: Streaming, record: Record) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel(SSE_BUFFER);
    let upstream = events(s, record);
    tokio::spawn(async move {
        let mut upstream = std::pin::pin!(upstream);
        loop {
            let ev = tokio::select! {
                ev = upstream.next() => ev,
                () = tx.closed() => return,
            };
            let Some(ev) = ev else { return };
            match tokio::time::timeout(SSE_WRITE_TIMEOUT, tx.send(ev)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return,
                Err(_) => {
                    tracing::warn!(
                        timeout = ?SSE_WRITE_TIMEOUT,
                        "streaming client stopped reading: request dropped"
                    );
                    return;
                }
            }
        }
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

fn events(s: Streaming, record: Record) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut state = State {
        s,
        record,
        queue: VecDeque::new(),
        done: false,
    };
    // The opening chunk of each choice: the role (chat) or empty text, before any token.
    for index in 0..state.s.outs.len() {
        state.push(
            index,
            Token {
                id: 0,
                text: String::new(),
                finish: None,
                logprobs: None,
                prompt_logprobs: Vec::new(),
            },
        );
    }
    stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.queue.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.done {
                return None;
            }
            match st.s.choices.next().await {
                Some((i, ChoiceEvent::Token(token))) => st.push(i, token),
                Some((i, ChoiceEvent::Ended(summary))) => st.ended(i, *summary),
                Some((_, ChoiceEvent::Failed(e))) => st.fail(&e),
                None => st.fail(&crate::error::RouterError::Internal(
                    "token stream ended early".into(),
                )),
            }
        }
    })
}
