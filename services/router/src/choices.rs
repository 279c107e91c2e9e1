//! The `n` choices of one request, each a [`Generation`] of its own (dispatched through the
//! [`Disagg`] seam) driven by its own task, their events merged in arrival order.
//!
//! Choice 0 is dispatched at once; the others when its first token arrives. By then its
//! prompt's KV is committed in its decode worker's prefix cache under the request's namespace,
//! and the namespace's affinity routes the other choices to the same workers: they reuse the
//! prompt's full pages read-only, and prefill computes only what no full page holds (the
//! prompt's tail). Each choice samples with its own seed (`seed + index`, set by the caller).
//!
//! Dropping [`Choices`] (the client went away) closes the channel; each task then drops its
//! generation, which aborts both halves.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::disagg::{Disagg, Generation, Summary};
use crate::dispatch::{Job, Token};
use crate::error::RouterError;

/// What one choice did next.
pub enum ChoiceEvent {
    /// A token (the last one carries the finish reason).
    Token(Token),
    /// The choice ended after its last token: its account.
    Ended(Summary),
    /// The choice failed; the response fails with it.
    Failed(RouterError),
}

/// Events buffered between the choices' tasks and the response.
const CHANNEL: usize = 64;

/// A request's choices in flight.
pub struct Choices {
    rx: mpsc::Receiver<(usize, ChoiceEvent)>,
    tx: mpsc::Sender<(usize, ChoiceEvent)>,
    /// Choices 1.. not dispatched yet (they wait for choice 0's first token).
    later: Vec<Job>,
    disagg: Arc<dyn Disagg>,
    /// Choices that have not ended or failed yet.
    open: usize,
}

impl Choices {
    /// Dispatches the first of `jobs` (one per choice, in index order; at least one) now;
    /// the rest follow its first token.
    pub fn start(disagg: Arc<dyn Disagg>, jobs: Vec<Job>) -> Result<Choices, RouterError> {
        let open = jobs.len();
        let mut jobs = jobs.into_iter();
        let first = jobs
            .next()
            .ok_or_else(|| RouterError::Internal("a request without choices".into()))?;
        let generation = disagg.dispatch(first)?;
        let (tx, rx) = mpsc::channel(CHANNEL);
        tokio::spawn(drive(0, generation, tx.clone()));
        Ok(Choices {
            rx,
            tx,
            later: jobs.collect(),
            disagg,
            open,
        })
    }

    /// The next event of any choice, with its index; `None` once every choice has ended.
    pub async fn next(&mut self) -> Option<(usize, ChoiceEvent)> {
        if self.open == 0 {
            return None;
        }
        let (index, event) = self.rx.recv().await?;
        match &event {
            ChoiceEvent::Token(_) if index == 0 && !self.later.is_empty() => self.start_later(),
            ChoiceEvent::Token(_) => {}
            ChoiceEvent::Ended(_) | ChoiceEvent::Failed(_) => self.open -= 1,
        }
        Some((index, event))
    }

    fn start_later(&mut self) {
        for (k, job) in std::mem::take(&mut self.later).into_iter().enumerate() {
            let index = k + 1;
            match self.disagg.dispatch(job) {
                Ok(generation) => {
                    tokio::spawn(drive(index, generation, self.tx.clone()));
                }
                Err(e) => {
                    let tx = self.tx.clone();
                    tokio::spawn(async move {
                        let _ = tx.send((index, ChoiceEvent::Failed(e))).await;
                    });
                }
            }
        }
    }
}

/// Drives one choice to its end, sending its events; returns early (dropping the generation,
/// which aborts both halves) once nobody receives them.
async fn drive(
    index: usize,
    mut generation: Box<dyn Generation>,
    tx: mpsc::Sender<(usize, ChoiceEvent)>,
) {
    loop {
        let next = tokio::select! {
            next = generation.next() => next,
            () = tx.closed() => return,
        };
        let event = match next {
            Some(Ok(token)) => {
                let last = token.finish.is_some();
                if tx.send((index, ChoiceEvent::Token(token))).await.is_err() {
                    return;
                }
                if !last {
                    continue;
                }
                ChoiceEvent::Ended(generation.summary())
            }
            Some(Err(e)) => ChoiceEvent::Failed(e),
            None => ChoiceEvent::Failed(RouterError::Internal("token stream ended early".into())),
        };
        let _ = tx.send((index, event)).await;
        return;
    }
}
