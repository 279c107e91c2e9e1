//! Pages as you go (I9): a sequence gets a page for its next token just before the step that
//! writes it; when the pool is short the youngest sequences (by arrival) are preempted, their
//! pages freed, and recomputed later on this worker's engine from their token ids (vLLM's
//! recompute preemption), a chunk per model-thread turn, turns alternating with decode steps.
//!
//! Why recompute here rather than through prefill: decode keeps every sequence's token ids
//! (the prompt's come with `Reserve`), so the recompute needs no grant, no transfer and no
//! router round trip; the pages are local (`KvPool::allocate`: fresh generations, no grant, so
//! no remote write can land in them, I4), written only by decode's engine through
//! `ReadablePages` and read back generation-checked (I1). The K/V a row gets depend only on
//! the tokens up to it and are computed by the same kernels in a prefill pass as in decode
//! steps, so the recomputed sequence continues with the text an undisturbed run produces.

use pagewarden_common::RequestId;
use pagewarden_kvcache::{ReserveError, SharedPages};
use pagewarden_worker::ComputeError;

use super::prefix::pin_prefix;
use super::{Done, Scheduler};
use crate::state::{RequestState, Running};

impl Scheduler {
    /// Gives the model thread its next turn: a recompute chunk or a decode step, alternating
    /// while both have work.
    pub(super) fn start_work(&mut self) {
        let recompute = !self.recomputing.is_empty();
        if recompute && self.recompute_turn {
            self.recompute_turn = false;
            if self.start_recompute() {
                return;
            }
        }
        if self.start_step() {
            self.recompute_turn = true;
        } else if recompute {
            self.start_recompute();
        }
    }

    /// Pages free for new work (a grant, a recompute): free pages less those owed to
    /// reservations, less one page of headroom per generating sequence, so what is admitted
    /// now does not force a preemption at the next page boundary (vLLM's watermark, sized by
    /// the batch instead of the pool).
    pub(super) fn spare_pages(&self) -> usize {
        let generating = self
            .table
            .values()
            .filter(|e| match &e.state {
                RequestState::Running(_) | RequestState::Stepping { .. } => true,
                RequestState::Queued(_)
                | RequestState::Reserved(_)
                | RequestState::Preempted(_)
                | RequestState::Recomputing(_)
                | RequestState::Finished
                | RequestState::Aborted => false,
            })
            .count();
        // Cached prefix pages nobody reads count as free: an allocation evicts them (I9).
        self.deps
            .pool
            .available_pages()
            .saturating_sub(self.owed_pages() + generating)
    }

    /// Gives every sequence of the batch a page for its next token, preempting the youngest
    /// sequence holding pages (in the batch, this one included, or out of it) while the pool
    /// has none. Sequences preempted out of the batch leave it.
    pub(super) fn make_room(&mut self, seqs: &mut Vec<(RequestId, Box<Running>)>) {
        let mut i = 0;
        while i < seqs.len() {
            let next = seqs[i].1.pages.len() + 1;
            match seqs[i].1.pages.grow(next) {
                Ok(()) => i += 1,
                Err(ReserveError::Exhausted { .. }) => {
                    let in_batch = seqs
                        .iter()
                        .enumerate()
                        .max_by_key(|(_, (_, r))| r.seq.arrival)
                        .map(|(j, (_, r))| (r.seq.arrival, j));
                    let Some((batch_arrival, j)) = in_batch else {
                        break;
                    };
                    match self.youngest_holding_pages() {
                        Some((arrival, req)) if arrival > batch_arrival => {
                            self.preempt_in_table(req)
                        }
                        Some(_) | None => {
                            let (req, r) = seqs.remove(j);
                            self.preempt(req, r);
                            if j < i {
                                i -= 1;
                            }
                        }
                    }
                }
                Err(e @ (ReserveError::TooLarge { .. } | ReserveError::ZeroTokens)) => {
                    // Admission keeps prompt + max_tokens within the pool: not reached.
                    let (req, r) = seqs.remove(i);
                    self.fail(req, r, ComputeError::Failed(e.to_string()));
                }
            }
        }
    }

    /// The youngest sequence outside the model thread that holds pages it could give up.
    fn youngest_holding_pages(&self) -> Option<(u64, RequestId)> {
        self.table
            .iter()
            .filter_map(|(req, e)| Some((e.state.preemptible()?.seq.arrival, *req)))
            .max()
    }

    pub(super) fn preempt_in_table(&mut self, req: RequestId) {
        let Some(entry) = self.table.get_mut(&req) else {
            return;
        };
        match std::mem::replace(&mut entry.state, RequestState::Aborted) {
            RequestState::Running(r) | RequestState::Recomputing(r) => {
                self.recomputing.retain(|x| *x != req);
                self.preempt(req, r);
            }
            other @ (RequestState::Queued(_)
            | RequestState::Reserved(_)
            | RequestState::Preempted(_)
            | RequestState::Stepping { .. }
            | RequestState::Finished
            | RequestState::Aborted) => entry.state = other,
        }
    }

    /// Frees the sequence's pages and keeps the rest of it (token ids, sampler, output) to be
    /// recomputed when pages free up.
    fn preempt(&mut self, req: RequestId, r: Box<Running>) {
        // The cached prefix is unpinned too (evictable again); it is looked up anew on resume.
        let Running {
            prefix: _,
            pages,
            mut seq,
        } = *r;
        seq.preemptions = seq.preemptions.saturating_add(1);
        let freed = pages.table().len();
        drop(pages);
        tracing::info!(
            request = %req,
            tokens = seq.kv_len(),
            pages = freed,
            "preempted: pages freed, to be recomputed"
        );
        self.deps.metrics.preempted();
        self.preempted.insert(seq.arrival, req);
        if let Some(entry) = self.table.get_mut(&req) {
            entry.state = RequestState::Preempted(Box::new(seq));
        }
    }

    /// Gives preempted sequences, oldest first, fresh pages for their KV and next token while
    /// they fit in the spare pages; each is then recomputed a chunk per turn. A sequence whose
    /// tenant would be over its share while another tenant waits is passed over (`share.rs`).
    /// Whether one that may resume still waits for pages (then nothing new is granted).
    pub(super) fn resume_preempted(&mut self) -> bool {
        let order: Vec<(u64, RequestId)> = self.preempted.iter().map(|(&a, &r)| (a, r)).collect();
        for (arrival, req) in order {
            let Some(entry) = self.table.get_mut(&req) else {
                self.preempted.remove(&arrival);
                continue;
            };
            let seq = match std::mem::replace(&mut entry.state, RequestState::Aborted) {
                RequestState::Preempted(seq) if seq.arrival == arrival => seq,
                other @ (RequestState::Queued(_)
                | RequestState::Reserved(_)
                | RequestState::Running(_)
                | RequestState::Preempted(_)
                | RequestState::Recomputing(_)
                | RequestState::Stepping { .. }
                | RequestState::Finished
                | RequestState::Aborted) => {
                    entry.state = other;
                    self.preempted.remove(&arrival);
                    continue;
                }
            };
            if seq.tx.is_closed() {
                // Nobody is reading: no recompute for it.
                entry.ended_at = Some(tokio::time::Instant::now());
                self.preempted.remove(&arrival);
                self.deps.metrics.request("client_gone");
                continue;
            }
            entry.state = RequestState::Preempted(seq);
            let tenant = entry.tenant.clone();
            let Some(RequestState::Preempted(seq)) = self.table.get(&req).map(|e| &e.state) else {
                continue;
            };
            // What the cache still holds of it needs no recompute (nor pages).
            let prefix = pin_prefix(
                &self.deps,
                seq.namespace.as_ref(),
                &seq.tokens[..seq.kv_len()],
            );
            let held = prefix.as_ref().map_or(0, SharedPages::len);
            let tokens = seq.kv_len() + 1 - held;
            let owner = seq.owner.clone();
            let need = self.deps.pool.layout().pages_for(tokens);
            if self.resume_deferred(&tenant, need) {
                continue;
            }
            if need > self.spare_pages() {
                return true;
            }
            match self.deps.pool.allocate(owner, tokens) {
                Ok(pages) => {
                    self.preempted.remove(&arrival);
                    let Some(entry) = self.table.get_mut(&req) else {
                        continue;
                    };
                    let RequestState::Preempted(seq) =
                        std::mem::replace(&mut entry.state, RequestState::Aborted)
                    else {
                        unreachable!("checked above, nothing ran between");
                    };
                    let r = Box::new(Running {
                        prefix,
                        pages,
                        seq: *seq,
                    });
                    if r.kv_held() == r.seq.kv_len() {
                        entry.state = RequestState::Running(r);
                    } else {
                        entry.state = RequestState::Recomputing(r);
                        self.recomputing.push_back(req);
                    }
                }
                Err(e) => {
                    // Counted as spare just above: only a racing release path gets here.
                    tracing::warn!(request = %req, error = %e, "recompute waits for pages");
                    return true;
                }
            }
        }
        false
    }

    /// Starts the next chunk of the first sequence being recomputed. Whether one started.
    fn start_recompute(&mut self) -> bool {
        while let Some(req) = self.recomputing.pop_front() {
            let Some(entry) = self.table.get_mut(&req) else {
                continue;
            };
            let r = match std::mem::replace(
                &mut entry.state,
                RequestState::Stepping { abort: false },
            ) {
                RequestState::Recomputing(r) => r,
                other @ (RequestState::Queued(_)
                | RequestState::Reserved(_)
                | RequestState::Running(_)
                | RequestState::Preempted(_)
                | RequestState::Stepping { .. }
                | RequestState::Finished
                | RequestState::Aborted) => {
                    entry.state = other;
                    continue;
                }
            };
            let from = r.kv_held();
            let to = (from + self.deps.recompute_chunk).min(r.seq.kv_len());
            let tokens = r.seq.tokens[from..to].to_vec();
            self.deps.metrics.iteration(tokens.len());
            let compute = self.deps.compute.clone();
            self.step = Some(tokio::task::spawn_blocking(move || {
                let mut r = r;
                let Running { prefix, pages, .. } = &mut *r;
                let result = compute
                    .prefill_after(prefix.as_ref(), pages, &tokens)
                    .map(drop);
                Done::Recompute(req, r, result)
            }));
            return true;
        }
        false
    }

    /// A recompute chunk came back: the sequence runs again once whole, else waits for its
    /// next turn (first in line).
    pub(super) fn finish_recompute(
        &mut self,
        req: RequestId,
        r: Box<Running>,
        result: Result<(), ComputeError>,
    ) {
        if let Some(entry) = self.back_from_model(req, &r) {
            match result {
                Ok(()) if r.kv_held() == r.seq.kv_len() => {
                    tracing::info!(request = %req, tokens = r.kv_held(), "recomputed");
                    entry.state = RequestState::Running(r);
                }
                Ok(()) => {
                    entry.state = RequestState::Recomputing(r);
                    self.recomputing.push_front(req);
                }
                Err(e) => self.fail(req, r, e),
            }
        }
        self.admit_waiting();
    }
}
