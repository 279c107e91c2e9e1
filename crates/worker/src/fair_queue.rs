//! `FairQueue`: the waiting line of a worker, FIFO within a tenant and weighted round robin
//! across tenants (each tenant's turn serves up to its weight of requests, from the tenants
//! file's `weight`), so one tenant's flood cannot push another tenant's request to the back.
//!
//! Both workers keep requests that fit the context but not the free pages (or compute) here;
//! a queued request holds no pages. The queue only orders: bounds, deadlines and what "fits"
//! means are the caller's.

use std::collections::VecDeque;

use pagewarden_common::TenantId;

/// One tenant's place in the rotation.
#[derive(Debug)]
struct Line<T> {
    tenant: TenantId,
    /// Items its turn may take (at least 1).
    weight: u32,
    /// Items taken in its current turn.
    taken: u32,
    items: VecDeque<T>,
}

/// Per-tenant FIFOs served in weighted rotation: the next item is the head of the tenant at
/// the front of the rotation; once that tenant has had `weight` items in this turn (or has none
/// left), it goes to the back.
#[derive(Debug)]
pub struct FairQueue<T> {
    rotation: VecDeque<Line<T>>,
    len: usize,
    /// Whether the line at the back got there because its turn just ended (no other line was
    /// served since): a tenant new to the rotation then goes ahead of it.
    back_just_served: bool,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            rotation: VecDeque::new(),
            len: 0,
            back_just_served: false,
        }
    }
}

impl<T> FairQueue<T> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `item` to `tenant`'s line; a tenant new to the rotation joins at its back, but
    /// ahead of a tenant whose turn just ended there (as in deficit round robin, where the
    /// newcomer joins the round that tenant has just had its share of: with one tenant served
    /// turn after turn, a newcomer is next instead of one turn later). The tenant's weight is
    /// the latest given (0 counts as 1).
    pub fn push(&mut self, tenant: &TenantId, weight: u32, item: T) {
        let weight = weight.max(1);
        match self.rotation.iter_mut().find(|l| l.tenant == *tenant) {
            Some(line) => {
                line.weight = weight;
                line.items.push_back(item);
            }
            None => {
                let line = Line {
                    tenant: tenant.clone(),
                    weight,
                    taken: 0,
                    items: VecDeque::from([item]),
                };
                if self.back_just_served {
                    self.rotation.insert(self.rotation.len() - 1, line);
                } else {
                    self.rotation.push_back(line);
                }
            }
        }
        self.len += 1;
    }

    /// Whether a tenant other than `tenant` has an item waiting.
    pub fn waits_besides(&self, tenant: &TenantId) -> bool {
        self.rotation.iter().any(|l| l.tenant != *tenant)
    }

    /// Whether `tenant` has an item waiting.
    pub fn waits(&self, tenant: &TenantId) -> bool {
        self.rotation.iter().any(|l| l.tenant == *tenant)
    }

    /// The item that [`FairQueue::pop`] would return.
    pub fn peek(&self) -> Option<&T> {
        self.rotation.front().and_then(|l| l.items.front())
    }

    /// Takes the next item; its tenant goes to the back of the rotation once its turn has had
    /// `weight` items.
    pub fn pop(&mut self) -> Option<T> {
        let mut line = self.rotation.pop_front()?;
        let item = line.items.pop_front();
        line.taken += 1;
        self.back_just_served = false;
        if !line.items.is_empty() {
            if line.taken < line.weight {
                self.rotation.push_front(line);
            } else {
                line.taken = 0;
                self.rotation.push_back(line);
                self.back_just_served = true;
            }
        }
        if item.is_some() {
            self.len -= 1;
        }
        item
    }

    /// Takes the next item that `fits` now: the head when it fits; when it does not (it waits
    /// for pages or a slot), the first fitting head of a later tenant's line that `may_pass`
    /// accepts, in rotation order, that line keeping its place. The callers let a tenant with
    /// nothing in service pass: one tenant's blocked head then never holds back another
    /// tenant's first request, and the head cannot starve, since its own tenant's requests in
    /// service end and free what it waits for (once they have, its tenant passes too).
    pub fn pop_fitting(
        &mut self,
        mut fits: impl FnMut(&T) -> bool,
        mut may_pass: impl FnMut(&TenantId) -> bool,
    ) -> Option<T> {
        if fits(self.peek()?) {
            return self.pop();
        }
        let i = (1..self.rotation.len()).find(|&i| {
            let line = &self.rotation[i];
            may_pass(&line.tenant) && line.items.front().is_some_and(&mut fits)
        })?;
        let line = &mut self.rotation[i];
        let item = line.items.pop_front();
        if line.items.is_empty() {
            self.rotation.remove(i);
            self.back_just_served = false;
        }
        self.len -= 1;
        item
    }

    /// Removes and returns the first item (in any tenant's line) that `pred` accepts; the
    /// rotation order of the others is kept.
    pub fn remove_first(&mut self, mut pred: impl FnMut(&T) -> bool) -> Option<T> {
        for i in 0..self.rotation.len() {
            let line = &mut self.rotation[i].items;
            if let Some(j) = line.iter().position(&mut pred) {
                let item = line.remove(j);
                if line.is_empty() {
                    self.rotation.remove(i);
                    self.back_just_served = false;
                }
                self.len -= 1;
                return item;
            }
        }
        None
    }

    /// Removes and returns every item that `pred` accepts.
    pub fn drain_matching(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for line in self.rotation.iter_mut() {
            let mut kept = VecDeque::with_capacity(line.items.len());
            for item in line.items.drain(..) {
                if pred(&item) {
                    out.push(item);
                } else {
                    kept.push_back(item);
                }
            }
            line.items = kept;
        }
        let lines = self.rotation.len();
        self.rotation.retain(|l| !l.items.is_empty());
        if self.rotation.len() != lines {
            self.back_just_served = false;
        }
        self.len -= out.len();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> TenantId {
        TenantId::new(name)
    }

    #[test]
    fn fifo_within_a_tenant_round_robin_across_tenants() {
        let mut q = FairQueue::new();
        for i in 0..4 {
            q.push(&t("flood"), 1, format!("a{i}"));
        }
        q.push(&t("quiet"), 1, "b0".to_string());
        q.push(&t("quiet"), 1, "b1".to_string());
        assert_eq!(q.len(), 6);
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ["a0", "b0", "a1", "b1", "a2", "a3"]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_tenant_of_weight_w_gets_w_turns_for_each_of_the_others() {
        let mut q = FairQueue::new();
        for i in 0..6 {
            q.push(&t("heavy"), 3, format!("h{i}"));
        }
        for i in 0..3 {
            q.push(&t("light"), 1, format!("l{i}"));
        }
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            ["h0", "h1", "h2", "l0", "h3", "h4", "h5", "l1", "l2"]
        );
        // A weight of 0 counts as 1: the tenant is still served.
        q.push(&t("zero"), 0, "z0".to_string());
        q.push(&t("zero"), 0, "z1".to_string());
        q.push(&t("other"), 1, "o0".to_string());
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ["z0", "o0", "z1"]);
    }

    #[test]
    fn a_newcomer_goes_ahead_of_the_tenant_whose_turn_just_ended() {
        let mut q = FairQueue::new();
        for i in 0..3 {
            q.push(&t("flood"), 1, format!("a{i}"));
        }
        assert_eq!(q.pop().as_deref(), Some("a0"));
        q.push(&t("quiet"), 1, "b0".to_string());
        assert_eq!(q.pop().as_deref(), Some("b0"));
        // Once another tenant was served, the back is the rightful next again.
        assert_eq!(q.pop().as_deref(), Some("a1"));
        q.push(&t("third"), 1, "c0".to_string());
        assert_eq!(q.pop().as_deref(), Some("c0"));
        q.push(&t("quiet"), 1, "b1".to_string());
        q.push(&t("fourth"), 1, "d0".to_string());
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ["a2", "b1", "d0"]);
    }

    #[test]
    fn an_idle_tenant_passes_a_blocked_head_and_nothing_else_does() {
        let mut q = FairQueue::new();
        // Sizes; "flood" has requests in service, "idle" and "busy" wait behind its head.
        q.push(&t("flood"), 1, 64);
        q.push(&t("flood"), 1, 64);
        q.push(&t("busy"), 1, 2);
        q.push(&t("idle"), 1, 2);
        q.push(&t("idle"), 1, 3);
        let fits = |&n: &i32| n <= 8;
        let idle = |tenant: &TenantId| *tenant == t("idle");
        // The head (64) does not fit: "busy" may not pass it, "idle"'s first may.
        assert_eq!(q.pop_fitting(fits, idle), Some(2));
        assert_eq!(q.len(), 4);
        // Its line keeps its place: still behind the blocked head.
        assert_eq!(q.pop_fitting(fits, |_| false), None);
        assert_eq!(q.pop_fitting(|_| true, idle), Some(64));
        assert_eq!(q.pop(), Some(2));
        assert_eq!(q.pop(), Some(3));
        assert_eq!(q.pop(), Some(64));
        assert_eq!(q.pop_fitting(|_| true, |_| true), None);
        assert!(q.is_empty());
        q.push(&t("flood"), 1, 1);
        assert!(!q.waits_besides(&t("flood")));
        assert!(q.waits_besides(&t("idle")));
    }

    #[test]
    fn removing_keeps_the_rest_in_order() {
        let mut q = FairQueue::new();
        q.push(&t("a"), 1, 1);
        q.push(&t("b"), 1, 2);
        q.push(&t("a"), 1, 3);
        assert_eq!(q.remove_first(|&x| x == 2), Some(2));
        assert_eq!(q.remove_first(|&x| x == 9), None);
        assert_eq!(q.peek(), Some(&1));
        assert_eq!(q.drain_matching(|&x| x > 2), vec![3]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop(), None);
        assert_eq!(q.len(), 0);
    }
}
