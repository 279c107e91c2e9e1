//! The batching half of the scheduler: which running sequences go into the next step (the
//! fair rotation), and what each one's sampled token does when the step returns.

use tokio::time::Instant;

use pagewarden_common::integrity::{IntegrityEvent, IntegrityKind};
use pagewarden_common::RequestId;
use pagewarden_model::Sampled;
use pagewarden_worker::{ComputeError, WorkerError};

use super::prefix::finish_sequence;
use super::{Done, Scheduler};
use crate::events;
use crate::rotation::Turn;
use crate::state::{Entry, RequestState, Running};

impl Scheduler {
    /// Emits `token` for a running request and ends it if it finished or its client is gone.
    pub(super) fn accept(&mut self, req: RequestId, sampled: Sampled) {
        let token = sampled.token;
        let Some(entry) = self.table.get_mut(&req) else {
            return;
        };
        let state = std::mem::replace(&mut entry.state, RequestState::Aborted);
        let RequestState::Running(mut r) = state else {
            entry.state = state;
            return;
        };
        let emitted = r.seq.output.push(token);
        let now = Instant::now();
        match r.seq.last_emit {
            None => self
                .deps
                .metrics
                .observe_ttft((now - r.seq.received_at).as_secs_f64()),
            Some(prev) => self
                .deps
                .metrics
                .observe_inter_token((now - prev).as_secs_f64()),
        }
        r.seq.last_emit = Some(now);
        if !emitted.end_of_generation {
            self.deps.metrics.generated(1);
        }
        let finish = emitted.finish;
        let mut event = events::token(req, entry.attempt, emitted, sampled.logprobs);
        // The last event says what the sequence was computed over: built once, at its end.
        event.account = finish.and_then(|f| events::account(f, &r));
        let sent = r.seq.tx.send(Ok(event)).is_ok();
        match (finish, sent) {
            (Some(f), _) => {
                entry.state = RequestState::Finished;
                entry.ended_at = Some(now);
                self.deps.metrics.request(f.as_str());
                // Its prompt pages may serve the namespace's next prompt.
                finish_sequence(&self.deps, *r);
            }
            (None, false) => {
                // The client dropped the stream: abort (pages freed with `r`).
                entry.state = RequestState::Aborted;
                entry.ended_at = Some(now);
                self.deps.metrics.request("client_gone");
            }
            (None, true) => {
                // The next input: its KV is written by the next step.
                r.seq.tokens.push(token);
                entry.state = RequestState::Running(r);
            }
        }
    }

    /// Starts one batched step of the next sequences in the rotation, each with a page for its
    /// next token (preempting the youngest when the pool is short). Whether a step started.
    pub(super) fn start_step(&mut self) -> bool {
        let mut seqs = Vec::new();
        let table = &mut self.table;
        let metrics = &self.deps.metrics;
        self.rotation.next_batch(self.deps.max_batch, |req, room| {
            let Some(entry) = table.get_mut(&req) else {
                return Turn::Gone;
            };
            match entry.state {
                RequestState::Running(_) => {}
                // A preempted sequence keeps its place: it is stepped again once recomputed.
                RequestState::Stepping { .. }
                | RequestState::Preempted(_)
                | RequestState::Recomputing(_) => return Turn::Busy,
                RequestState::Queued(_)
                | RequestState::Reserved(_)
                | RequestState::Finished
                | RequestState::Aborted => return Turn::Gone,
            }
            if !room {
                return Turn::Ready;
            }
            let RequestState::Running(r) =
                std::mem::replace(&mut entry.state, RequestState::Stepping { abort: false })
            else {
                unreachable!("matched Running just above")
            };
            if r.seq.tx.is_closed() {
                entry.state = RequestState::Aborted;
                entry.ended_at = Some(Instant::now());
                metrics.request("client_gone");
                return Turn::Gone;
            }
            seqs.push((req, r));
            Turn::Ready
        });
        self.make_room(&mut seqs);
        if seqs.is_empty() {
            return false;
        }
        // One token per sequence in the batch.
        self.deps.metrics.iteration(seqs.len());
        let compute = self.deps.compute.clone();
        self.step = Some(tokio::task::spawn_blocking(move || {
            let mut seqs = seqs;
            let results = {
                let mut batch: Vec<_> = seqs
                    .iter_mut()
                    .map(|(_, r)| {
                        let next = r.seq.next_input();
                        (r.prefix.as_ref(), &mut r.pages, next)
                    })
                    .collect();
                compute.decode_step_after(&mut batch)
            };
            Done::Step(
                seqs.into_iter()
                    .zip(results)
                    .map(|((req, mut r), logits)| {
                        let tok = logits.map(|l| r.seq.sampler.next(&l));
                        (req, r, tok)
                    })
                    .collect(),
            )
        }));
        true
    }

    /// The entry of a sequence back from the model thread (a step or a recompute chunk), to
    /// be updated by the caller; `None` when the request is gone, or was aborted meanwhile:
    /// then it ends here (its abort event sent, its state `Aborted`) and the caller drops the
    /// sequence, freeing its pages.
    pub(super) fn back_from_model(
        &mut self,
        req: RequestId,
        running: &Running,
    ) -> Option<&mut Entry> {
        let entry = self.table.get_mut(&req)?;
        let aborted = match entry.state {
            RequestState::Stepping { abort } => abort,
            RequestState::Queued(_)
            | RequestState::Reserved(_)
            | RequestState::Running(_)
            | RequestState::Preempted(_)
            | RequestState::Recomputing(_)
            | RequestState::Finished
            | RequestState::Aborted => true,
        };
        if aborted {
            let _ = running.seq.tx.send(Ok(events::abort(req, entry.attempt)));
            entry.state = RequestState::Aborted;
            entry.ended_at = Some(Instant::now());
            return None;
        }
        Some(entry)
    }

    pub(super) fn finish_step(
        &mut self,
        results: Vec<(RequestId, Box<Running>, Result<Sampled, ComputeError>)>,
    ) {
        for (req, running, result) in results {
            let Some(entry) = self.back_from_model(req, &running) else {
                continue;
            };
            match result {
                Ok(token) => {
                    entry.state = RequestState::Running(running);
                    self.accept(req, token);
                }
                Err(e) => self.fail(req, running, e),
            }
        }
        self.admit_waiting();
    }

    /// Ends a sequence whose step (or recompute) failed. I1/I8: fail only this request,
    /// count it, report it; never data. Its pages are freed with `running`.
    pub(super) fn fail(&mut self, req: RequestId, running: Box<Running>, e: ComputeError) {
        let kind = match e {
            ComputeError::KvRefused(_, page) => {
                self.deps.integrity.report(IntegrityEvent {
                    node_id: self.deps.node_id.clone(),
                    role: "decode",
                    kind: IntegrityKind::GenerationMismatch,
                    request: Some(req),
                    tenant: Some(running.seq.owner.tenant.clone()),
                    page,
                    detail: e.to_string(),
                });
                "kv_read_refused"
            }
            ComputeError::Failed(_) => "error",
        };
        tracing::warn!(request = %req, error = %e, "sequence failed");
        let _ = running.seq.tx.send(Err(WorkerError::Internal(format!(
            "generation failed: {e}"
        ))
        .into()));
        if let Some(entry) = self.table.get_mut(&req) {
            entry.state = RequestState::Aborted;
            entry.ended_at = Some(Instant::now());
        }
        self.deps.metrics.request(kind);
    }
}
