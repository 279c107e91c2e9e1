//! The streaming response: OpenAI chunks as server-sent events, an optional usage chunk, then
//! `data: [DONE]`. Headers and a first chunk (chat: the assistant role, empty content;
//! completions: empty text) go out as soon as the request is admitted, before any worker is
//! called, so a client sees progress while the request waits in a queue or its prompt runs
//! (keep-alive comments meanwhile). A worker failure after that becomes an `{"error": …}`
//! event. The stream owns the [`Flight`](crate::dispatch::Flight); a client that disconnects
//! drops it, which aborts both halves.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, Stream, StreamExt};
use pagewarden_proto::v1::Logprobs;

use crate::dispatch::Token;

use crate::record::Record;
use crate::respond::{finished, outcome_of_finish, Streaming};

struct State {
    s: Streaming,
    record: Record,
    queue: VecDeque<Event>,
    text: String,
    /// Logprobs of tokens whose text is not out yet: they go with the next chunk.
    logprobs: Vec<Logprobs>,
    first: bool,
    done: bool,
}

impl State {
    fn push(&mut self, token: Token) {
        self.logprobs.extend(token.logprobs);
        self.text.push_str(&token.text);
        // With tools, text that may be a call is held until the reply ends.
        let mut text = match self.s.tools.as_mut() {
            Some(reader) => reader.push(&token.text),
            None => token.text,
        };
        let mut finish = token.finish;
        let mut calls = Vec::new();
        if let (Some(f), Some(reader)) = (finish, self.s.tools.as_mut()) {
            let (end, f) = reader.finish(f);
            text.push_str(&end.text);
            calls = end.calls;
            finish = Some(f);
        }
        // Nothing to show (mid-UTF-8, or text held back for a possible stop sequence).
        if text.is_empty() && finish.is_none() && !self.first {
            return;
        }
        let logprobs = std::mem::take(&mut self.logprobs);
        let logprobs = if logprobs.is_empty() {
            serde_json::Value::Null
        } else {
            self.s.render_logprobs(&logprobs)
        };
        if calls.is_empty() {
            let chunk = self.s.meta.chunk(&text, finish, self.first, logprobs);
            self.queue.push_back(json_event(&chunk));
        } else {
            // Text before the calls, the calls, then the end.
            if !text.is_empty() || self.first {
                let chunk = self.s.meta.chunk(&text, None, self.first, logprobs);
                self.queue.push_back(json_event(&chunk));
            }
            let chunk = self.s.meta.tool_calls_chunk(&calls);
            self.queue.push_back(json_event(&chunk));
            let chunk = self
                .s
                .meta
                .chunk("", finish, false, serde_json::Value::Null);
            self.queue.push_back(json_event(&chunk));
        }
        self.first = false;
        if let Some(finish) = finish {
            if self.s.include_usage {
                let usage = self.s.flight.usage();
                self.queue
                    .push_back(json_event(&self.s.meta.usage_chunk(usage)));
            }
            self.record.set(outcome_of_finish(finish));
            finished(&self.s.state, &self.s, &self.text, finish);
            self.finish();
        }
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

fn events(mut s: Streaming, record: Record) -> impl Stream<Item = Result<Event, Infallible>> {
    // The opening chunk: the role (chat) or empty text, before any token.
    let first = s.first.take().unwrap_or(Token {
        id: 0,
        text: String::new(),
        finish: None,
        logprobs: None,
    });
    let mut state = State {
        s,
        record,
        queue: VecDeque::new(),
        text: String::new(),
        logprobs: Vec::new(),
        first: true,
        done: false,
    };
    state.push(first);
    stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.queue.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.done {
                return None;
            }
            match st.s.flight.next().await {
                Some(Ok(token)) => st.push(token),
                Some(Err(e)) => {
                    st.record.fail(&e);
                    st.queue.push_back(json_event(&serde_json::json!(e.body())));
                    st.finish();
                }
                None => {
                    let e = crate::error::RouterError::Internal("token stream ended early".into());
                    st.record.fail(&e);
                    st.queue.push_back(json_event(&serde_json::json!(e.body())));
                    st.finish();
                }
            }
        }
    })
}
