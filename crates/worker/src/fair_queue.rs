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
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            rotation: VecDeque::new(),
            len: 0,
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

    /// Appends `item` to `tenant`'s line; a tenant new to the rotation joins at its back. The
    /// tenant's weight is the latest given (0 counts as 1).
    pub fn push(&mut self, tenant: &TenantId, weight: u32, item: T) {
        let weight = weight.max(1);
        match self.rotation.iter_mut().find(|l| l.tenant == *tenant) {
            Some(line) => {
                line.weight = weight;
                line.items.push_back(item);
            }
            None => self.rotation.push_back(Line {
                tenant: tenant.clone(),
                weight,
                taken: 0,
                items: VecDeque::from([item]),
            }),
        }
        self.len += 1;
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
        if !line.items.is_empty() {
            if line.taken < line.weight {
                self.rotation.push_front(line);
            } else {
                line.taken = 0;
                self.rotation.push_back(line);
            }
        }
        if item.is_some() {
            self.len -= 1;
        }
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
        self.rotation.retain(|l| !l.items.is_empty());
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
