//! A tenant's share of this worker's KV pool while another tenant waits (I9, fair share).
//!
//! A tenant may hold any part of the pool while nobody else waits: pages left idle help no one.
//! When the queue's head cannot be granted for want of pages and its tenant holds less than
//! its share, the youngest sequences of tenants holding more than theirs are preempted
//! (recompute preemption: their clients' streams only pause) until the head fits or nobody is
//! over. A sequence preempted so stays preempted while its tenant would be over its share again
//! and another tenant waits.
//!
//! A tenant's share is the pool's pages split by weight among the tenants with a request here
//! (queued, holding pages, or preempted). Two rules keep it from starving anybody: a tenant's
//! last sequence holding pages is never taken for another's share (its oldest request always
//! makes progress), and a preempted sequence whose tenant holds nothing else may always resume.

use std::collections::HashMap;

use pagewarden_common::{RequestId, TenantId};

use super::Scheduler;
use crate::state::RequestState;

/// Pages each tenant holds now, and its share of the pool.
pub(super) struct Shares {
    held: HashMap<TenantId, usize>,
    share: HashMap<TenantId, usize>,
    /// Requests holding pages, per tenant.
    holders: HashMap<TenantId, usize>,
}

impl Shares {
    pub(super) fn held(&self, tenant: &TenantId) -> usize {
        self.held.get(tenant).copied().unwrap_or(0)
    }

    pub(super) fn share(&self, tenant: &TenantId) -> usize {
        self.share.get(tenant).copied().unwrap_or(0)
    }

    fn over_by(&self, tenant: &TenantId) -> usize {
        self.held(tenant).saturating_sub(self.share(tenant))
    }
}

impl Scheduler {
    /// Each tenant's pages now (from the pool's own record of who holds what) and its share.
    pub(super) fn shares(&self) -> Shares {
        let per_request = self.deps.pool.pages_per_request();
        let mut weights: HashMap<&TenantId, u64> = HashMap::new();
        let (mut held, mut holders) = (HashMap::new(), HashMap::new());
        for (req, e) in &self.table {
            let demand = match &e.state {
                RequestState::Queued(_) => true,
                other => other.is_active(),
            };
            if demand {
                weights.insert(&e.tenant, u64::from(e.weight.max(1)));
            }
            if let Some(&n) = per_request.get(req).filter(|&&n| n > 0) {
                *held.entry(e.tenant.clone()).or_insert(0) += n;
                *holders.entry(e.tenant.clone()).or_insert(0) += 1;
            }
        }
        let total: u64 = weights.values().sum();
        let pages = self.deps.pool.capacity_pages() as u64;
        let share = weights
            .into_iter()
            .map(|(t, w)| (t.clone(), (pages * w / total.max(1)) as usize))
            .collect();
        Shares {
            held,
            share,
            holders,
        }
    }

    /// Whether a preempted sequence of `tenant` needing `need` pages stays preempted: its
    /// tenant holds other pages, would hold more than its share with these, and another
    /// tenant waits.
    pub(super) fn resume_deferred(&self, tenant: &TenantId, need: usize) -> bool {
        if !self.queue.waits_besides(tenant) {
            return false;
        }
        let shares = self.shares();
        let held = shares.held(tenant);
        held > 0 && held + need > shares.share(tenant)
    }

    /// Preempts the youngest sequences of tenants over their share while the queue's head
    /// waits for pages and its tenant is under its own (see the module doc). Whether any was
    /// preempted.
    pub(super) fn reclaim_for_head(&mut self) -> bool {
        let mut any = false;
        while let Some(victim) = self.share_victim() {
            tracing::info!(request = %victim, "preempted for another tenant's share of the pool");
            self.deps.metrics.preempted_for_share();
            self.preempt_in_table(victim);
            any = true;
        }
        any
    }

    /// The next sequence to preempt for the head's sake, if any.
    fn share_victim(&self) -> Option<RequestId> {
        let &(head, attempt) = self.queue.peek()?;
        let entry = self.table.get(&head).filter(|e| e.attempt == attempt)?;
        let RequestState::Queued(q) = &entry.state else {
            return None;
        };
        let need = self.deps.pool.layout().pages_for(q.prompt.len() + 1);
        if need <= self.spare_pages() {
            return None;
        }
        let shares = self.shares();
        if shares.held(&entry.tenant) >= shares.share(&entry.tenant) {
            return None;
        }
        // The youngest sequence, outside the model thread, of the tenant most over its share
        // that holds pages with more than one request.
        self.table
            .iter()
            .filter(|(_, e)| {
                e.tenant != entry.tenant
                    && shares.over_by(&e.tenant) > 0
                    && shares.holders.get(&e.tenant).copied().unwrap_or(0) > 1
            })
            .filter_map(|(req, e)| {
                let r = e.state.preemptible()?;
                Some(((shares.over_by(&e.tenant), r.seq.arrival), *req))
            })
            .max_by_key(|(key, _)| *key)
            .map(|(_, req)| req)
    }
}
