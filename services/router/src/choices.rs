//! The choices of one request (`n` for each of its prompts), each a [`Generation`] of its own
//! (dispatched through the [`Disagg`] seam) driven by its own task, their events merged in
//! arrival order.
//!
//! A prompt's first choice is dispatched at once; its others when that one's first token
//! arrives. By then the prompt's KV is committed in its decode worker's prefix cache under the
//! request's namespace, and the namespace's affinity routes the other choices to the same
//! workers: they reuse the prompt's full pages read-only, and prefill computes only what no
//! full page holds (the prompt's tail). Each choice samples with its own seed (`seed + index`,
//! set by the caller).
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
    /// The choice ended after its last token: its account (boxed: it carries the choice's
    /// provenance, far larger than a token).
    Ended(Box<Summary>),
    /// The choice failed; the response fails with it.
    Failed(RouterError),
}

/// Events buffered between the choices' tasks and the response.
const CHANNEL: usize = 64;

/// A request's choices in flight.
pub struct Choices {
    rx: mpsc::Receiver<(usize, ChoiceEvent)>,
    tx: mpsc::Sender<(usize, ChoiceEvent)>,
    /// Per prompt: the index of its first choice, and its other choices not dispatched yet
    /// (they wait for the first one's first token).
    later: Vec<(usize, Vec<Job>)>,
    disagg: Arc<dyn Disagg>,
    /// Choices that have not ended or failed yet.
    open: usize,
}

impl Choices {
    /// Dispatches the first choice of each prompt (`groups`: per prompt, its choices' jobs in
    /// index order, indices running on across prompts; none empty) now; each prompt's other
    /// choices follow its first one's first token.
    pub fn start(disagg: Arc<dyn Disagg>, groups: Vec<Vec<Job>>) -> Result<Choices, RouterError> {
        let open = groups.iter().map(Vec::len).sum();
        if open == 0 || groups.iter().any(Vec::is_empty) {
            return Err(RouterError::Internal("a prompt without choices".into()));
        }
        let (tx, rx) = mpsc::channel(CHANNEL);
        let mut later = Vec::with_capacity(groups.len());
        let mut index = 0;
        for group in groups {
            let size = group.len();
            let mut jobs = group.into_iter();
            if let Some(first) = jobs.next() {
                let generation = disagg.dispatch(first)?;
                tokio::spawn(drive(index, generation, tx.clone()));
            }
            later.push((index, jobs.collect()));
            index += size;
        }
        Ok(Choices {
            rx,
            tx,
            later,
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
            ChoiceEvent::Token(_) => self.start_later(index),
            ChoiceEvent::Ended(_) | ChoiceEvent::Failed(_) => self.open -= 1,
        }
        Some((index, event))
    }

    /// Dispatches the other choices of the prompt whose first choice is `first`, if any wait.
    fn start_later(&mut self, first: usize) {
        let Some((_, jobs)) = self.later.iter_mut().find(|(f, _)| *f == first) else {
            return;
        };
        for (k, job) in std::mem::take(jobs).into_iter().enumerate() {
            let index = first + k + 1;
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
                ChoiceEvent::Ended(Box::new(generation.summary()))
            }
            Some(Err(e)) => ChoiceEvent::Failed(e),
            None => ChoiceEvent::Failed(RouterError::Internal("token stream ended early".into())),
        };
        let _ = tx.send((index, event)).await;
        return;
    }
}
