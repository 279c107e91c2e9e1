//! The batching half of the scheduler: which running sequences go into the next step (the
//! fair rotation), and what each one's sampled token does when the step returns.

use std::time::Instant;

use pagewarden_common::integrity::{IntegrityEvent, IntegrityKind};
use pagewarden_common::RequestId;
use pagewarden_model::Sampled;
use tonic::Status;

use super::{Scheduler, StepResult};
use crate::compute::StepError;
use crate::events;
use crate::output::Finish;
use crate::rotation::Turn;
use crate::state::RequestState;

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
        let emitted = r.output.push(token);
        let now = Instant::now();
        match r.last_emit {
            None => self
                .deps
                .metrics
                .observe_ttft((now - r.received_at).as_secs_f64()),
            Some(prev) => self
                .deps
                .metrics
                .observe_inter_token((now - prev).as_secs_f64()),
        }
        r.last_emit = Some(now);
        if !emitted.end_of_generation {
            self.deps.metrics.generated(1);
        }
        let finish = emitted.finish;
        let sent =
            r.tx.send(Ok(events::token(
                req,
                entry.attempt,
                emitted,
                sampled.logprobs,
            )))
            .is_ok();
        match (finish, sent) {
            (Some(f), _) => {
                entry.state = RequestState::Finished;
                entry.ended_at = Some(now);
                self.deps.metrics.request(match f {
                    Finish::Stop => "stop",
                    Finish::Length => "length",
                });
            }
            (None, false) => {
                // The client dropped the stream: abort (pages freed with `r`).
                entry.state = RequestState::Aborted;
                entry.ended_at = Some(now);
                self.deps.metrics.request("client_gone");
            }
            (None, true) => {
                r.next_input = token;
                entry.state = RequestState::Running(r);
            }
        }
    }

    pub(super) fn start_step(&mut self) {
        let mut seqs = Vec::new();
        let table = &mut self.table;
        let metrics = &self.deps.metrics;
        self.rotation.next_batch(self.deps.max_batch, |req, room| {
            let Some(entry) = table.get_mut(&req) else {
                return Turn::Gone;
            };
            match entry.state {
                RequestState::Running(_) => {}
                RequestState::Stepping { .. } => return Turn::Busy,
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
            if r.tx.is_closed() {
                entry.state = RequestState::Aborted;
                entry.ended_at = Some(Instant::now());
                metrics.request("client_gone");
                return Turn::Gone;
            }
            seqs.push((req, r));
            Turn::Ready
        });
        if seqs.is_empty() {
            return;
        }
        let compute = self.deps.compute.clone();
        self.step = Some(tokio::task::spawn_blocking(move || {
            let mut seqs = seqs;
            let results = {
                let mut batch: Vec<_> = seqs
                    .iter_mut()
                    .map(|(_, r)| (&mut r.pages, r.next_input))
                    .collect();
                compute.decode_step(&mut batch)
            };
            seqs.into_iter()
                .zip(results)
                .map(|((req, mut r), logits)| {
                    let tok = logits.map(|l| r.sampler.next(&l));
                    (req, r, tok)
                })
                .collect()
        }));
    }

    pub(super) fn finish_step(&mut self, results: StepResult) {
        for (req, running, result) in results {
            let Some(entry) = self.table.get_mut(&req) else {
                continue;
            };
            let aborted = match entry.state {
                RequestState::Stepping { abort } => abort,
                RequestState::Queued(_)
                | RequestState::Reserved(_)
                | RequestState::Running(_)
                | RequestState::Finished
                | RequestState::Aborted => true,
            };
            if aborted {
                let _ = running.tx.send(Ok(events::abort(req, entry.attempt)));
                entry.state = RequestState::Aborted;
                entry.ended_at = Some(Instant::now());
                continue;
            }
            match result {
                Ok(token) => {
                    entry.state = RequestState::Running(running);
                    self.accept(req, token);
                }
                Err(e) => {
                    // I1/I8: fail only this request, count it, report it; never data.
                    let kind = match e {
                        StepError::KvRefused(_) => {
                            self.deps.integrity.report(IntegrityEvent {
                                node_id: self.deps.node_id.clone(),
                                role: "decode",
                                kind: IntegrityKind::GenerationMismatch,
                                request: Some(req),
                                tenant: Some(running.owner.tenant.clone()),
                                detail: e.to_string(),
                            });
                            "kv_read_refused"
                        }
                        StepError::Failed(_) => "error",
                    };
                    tracing::warn!(request = %req, error = %e, "sequence failed");
                    let _ = running
                        .tx
                        .send(Err(Status::internal(format!("generation failed: {e}"))));
                    entry.state = RequestState::Aborted;
                    entry.ended_at = Some(Instant::now());
                    self.deps.metrics.request(kind);
                }
            }
        }
        self.admit_waiting();
    }
}
