//! The queue half of the scheduler (I9): admission and the stale check on `Reserve`, a place
//! in the fair queue, grants in queue order while the head's prompt fits in the spare pages,
//! and refusals when the queue is full or a wait passes its deadline.

use std::collections::{HashMap, HashSet};
use tokio::time::Instant;

use pagewarden_common::{AttemptId, RequestId, TenantId};
use pagewarden_kvcache::{ReserveError, SharedPages};
use pagewarden_worker::{QueueRefusal, WorkerError};

use super::prefix::pin_prompt_prefix;
use super::Scheduler;
use crate::state::{Entry, Granted, Queued, RequestState, Reservation};

impl Scheduler {
    /// Admission (I3, before anything else), the stale check (I5), then a place in the queue.
    /// Every outcome is answered on `q.reply`, at once or when the request leaves the queue.
    #[allow(clippy::result_large_err)]
    pub(super) fn enqueue(
        &mut self,
        req: RequestId,
        attempt: AttemptId,
        q: Queued,
    ) -> Result<(), (WorkerError, Queued)> {
        #[cfg(feature = "unsafe-test-switches")]
        let checked = pagewarden_common::test_switches::TestSwitches::current()
            .is_on(pagewarden_common::test_switches::Switch::WorkerAdmission);
        #[cfg(not(feature = "unsafe-test-switches"))]
        let checked = true;
        let admitted = if checked {
            self.deps
                .admission
                .check(q.prompt.len(), q.sampling.max_tokens)
                .map(|_| ())
        } else {
            Ok(())
        };
        if let Err(r) = admitted {
            self.deps.metrics.rejection(r.reason());
            self.deps.metrics.request("rejected");
            return Err((WorkerError::Rejected(r), q));
        }
        if let Some(old) = self.table.get(&req) {
            if old.attempt >= attempt {
                let what = format!("reserve of attempt {} after {}", attempt.0, old.attempt.0);
                return Err((self.stale(req, &what), q));
            }
            // A newer attempt supersedes the old one.
            self.abort(req, old.attempt, "superseded by a newer attempt");
        }
        // Joins the line, and is granted at once if it is the head and fits; only a request
        // that must wait counts against the queue's bound (`--max-queue 0`: never wait).
        self.queue.push(&q.owner.tenant, q.weight, (req, attempt));
        self.table.insert(
            req,
            Entry {
                attempt,
                tenant: q.owner.tenant.clone(),
                weight: q.weight.max(1),
                ended_at: None,
                state: RequestState::Queued(Box::new(q)),
            },
        );
        self.admit_waiting();
        if self.queue.len() > self.deps.max_queue {
            self.refuse_queued(
                req,
                attempt,
                QueueRefusal::Full {
                    limit: self.deps.max_queue,
                },
            );
        }
        Ok(())
    }

    /// Pages promised beyond what requests hold: each reservation's first-token page.
    pub(super) fn owed_pages(&self) -> usize {
        let pages_for = |t: usize| self.deps.pool.layout().pages_for(t);
        self.table
            .values()
            .map(|e| match &e.state {
                RequestState::Reserved(r) => {
                    pages_for(r.prompt.len() + 1) - pages_for(r.prompt.len())
                }
                RequestState::Queued(_)
                | RequestState::Running(_)
                | RequestState::Preempted(_)
                | RequestState::Recomputing(_)
                | RequestState::Stepping { .. }
                | RequestState::Finished
                | RequestState::Aborted => 0,
            })
            .sum()
    }

    /// Resumes preempted sequences first (they are older than anything queued), then grants
    /// queued requests, in queue order, while the next one's prompt fits in the spare pages.
    /// The head waits for room rather than being overtaken, so a long request is never starved
    /// by short ones, except by a tenant with no request active here: its first request that
    /// fits passes (`FairQueue::pop_fitting`), so one tenant's flood never holds another
    /// tenant's only request behind it. Nothing is granted while a preempted sequence that may
    /// resume still waits for pages. When the head still waits for pages, tenants over their
    /// share of the pool give sequences back for it (`share.rs`), and the round runs again.
    pub(super) fn admit_waiting(&mut self) {
        loop {
            if !self.resume_preempted() {
                self.grant_fitting();
            }
            if !self.reclaim_for_head() {
                break;
            }
        }
        self.deps.metrics.set_queue_depth(self.queue.len());
        self.deps.metrics.set_active(self.active());
    }

    /// Grants queued requests in queue order while the next one fits (see `admit_waiting`).
    fn grant_fitting(&mut self) {
        loop {
            let table = &self.table;
            // Left the queue another way (abort, newer attempt): only its place remains.
            if self
                .queue
                .remove_first(|&(r, a)| queued_prompt(table, r, a).is_none())
                .is_some()
            {
                continue;
            }
            let spare = self.spare_pages();
            let layout = self.deps.pool.layout();
            let active: HashSet<&TenantId> = table
                .values()
                .filter(|e| e.state.is_active())
                .map(|e| &e.tenant)
                .collect();
            let next = self.queue.pop_fitting(
                // A grant's pages: the prompt's, plus the page its first generated token may
                // need (the only headroom; later pages come as they are needed).
                |&(r, a)| {
                    queued_prompt(table, r, a).is_some_and(|n| layout.pages_for(n + 1) <= spare)
                },
                |tenant| !active.contains(tenant),
            );
            let Some((req, attempt)) = next else {
                break;
            };
            self.grant(req, attempt);
        }
    }

    /// Turns the queued request into a reservation and sends its grant.
    pub(super) fn grant(&mut self, req: RequestId, attempt: AttemptId) {
        let Some(entry) = self.table.get_mut(&req) else {
            return;
        };
        let Some(q) = entry.take_queued() else {
            return;
        };
        let Queued {
            owner,
            arrival,
            weight: _,
            prompt,
            sampling,
            namespace,
            reply,
            queued_at,
            deadline: _,
        } = *q;
        self.deps
            .metrics
            .observe_queue_time(queued_at.elapsed().as_secs_f64());
        // The prefix this worker holds is pinned first, so the grant covers only the rest and
        // nothing evicts the prefix meanwhile.
        let prefix = pin_prompt_prefix(&self.deps, &owner, namespace.as_ref(), &prompt);
        let held = prefix.as_ref().map_or(0, SharedPages::len);
        let pages = match self.deps.pool.reserve(owner.clone(), prompt.len() - held) {
            Ok(p) => p,
            Err(e) => {
                let error = match e {
                    ReserveError::Exhausted { .. } => {
                        WorkerError::Internal(format!("KV pool changed under the scheduler: {e}"))
                    }
                    ReserveError::TooLarge { .. } | ReserveError::ZeroTokens => {
                        WorkerError::Invalid(e.to_string())
                    }
                };
                entry.ended_at = Some(Instant::now());
                self.deps.metrics.request("error");
                let _ = reply.send(Err(error));
                return;
            }
        };
        let grant = pages.grant().clone();
        entry.state = RequestState::Reserved(Box::new(Reservation {
            owner,
            arrival,
            prefix,
            pages,
            prompt,
            sampling,
            namespace,
        }));
        let granted = Granted {
            grant,
            prefix_tokens: held,
        };
        if reply.send(Ok(granted)).is_err() {
            // The caller left between its last check and now: nothing was written.
            self.abort(req, attempt, "Reserve call gone before its grant");
        }
    }

    /// Ends a queued request with `refusal` (its deadline passed, or the queue is over its
    /// bound).
    pub(super) fn refuse_queued(
        &mut self,
        req: RequestId,
        attempt: AttemptId,
        refusal: QueueRefusal,
    ) {
        let Some(q) = self.leave_queue(req, attempt) else {
            return;
        };
        self.deps.metrics.rejection(refusal.reason());
        self.deps.metrics.request(refusal.reason().as_str());
        tracing::info!(request = %req, reason = %refusal.reason(), "refused from the queue");
        let _ = q.reply.send(Err(refusal.error("decode")));
    }

    /// Takes `req`'s queued `attempt` out of the queue, ended (it holds no pages); `None` when
    /// it is not queued.
    pub(super) fn leave_queue(
        &mut self,
        req: RequestId,
        attempt: AttemptId,
    ) -> Option<Box<Queued>> {
        let entry = self.table.get_mut(&req)?;
        let q = entry.take_queued()?;
        self.queue.remove_first(|&(r, a)| r == req && a == attempt);
        entry.ended_at = Some(Instant::now());
        Some(q)
    }
}

/// The prompt length of `req` while its `attempt` is queued; `None` once it left the queue.
fn queued_prompt(
    table: &HashMap<RequestId, Entry>,
    req: RequestId,
    attempt: AttemptId,
) -> Option<usize> {
    let e = table.get(&req).filter(|e| e.attempt == attempt)?;
    match &e.state {
        RequestState::Queued(q) => Some(q.prompt.len()),
        RequestState::Reserved(_)
        | RequestState::Running(_)
        | RequestState::Preempted(_)
        | RequestState::Recomputing(_)
        | RequestState::Stepping { .. }
        | RequestState::Finished
        | RequestState::Aborted => None,
    }
}
