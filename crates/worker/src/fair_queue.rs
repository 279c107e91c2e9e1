//! `FairQueue`: the waiting line of a worker, FIFO within a tenant and round robin across
//! tenants, so one tenant's flood cannot push another tenant's request to the back.
//!
//! Both workers keep requests that fit the context but not the free pages (or compute) here;
//! a queued request holds no pages. The queue only orders: bounds, deadlines and what "fits"
//! means are the caller's.

use std::collections::VecDeque;

use pagewarden_common::TenantId;

/// Per-tenant FIFOs served in rotation: the next item is the head of the tenant at the front of
/// the rotation; after it is taken, that tenant goes to the back.
#[derive(Debug)]
pub struct FairQueue<T> {
    rotation: VecDeque<(TenantId, VecDeque<T>)>,
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

    /// Appends `item` to `tenant`'s line; a tenant new to the rotation joins at its back.
    pub fn push(&mut self, tenant: &TenantId, item: T) {
        match self.rotation.iter_mut().find(|(t, _)| t == tenant) {
            Some((_, line)) => line.push_back(item),
            None => self
                .rotation
                .push_back((tenant.clone(), VecDeque::from([item]))),
        }
        self.len += 1;
    }

    /// The item that [`FairQueue::pop`] would return.
    pub fn peek(&self) -> Option<&T> {
        self.rotation.front().and_then(|(_, line)| line.front())
    }

    /// Takes the next item and moves its tenant to the back of the rotation.
    pub fn pop(&mut self) -> Option<T> {
        let (tenant, mut line) = self.rotation.pop_front()?;
        let item = line.pop_front();
        if !line.is_empty() {
            self.rotation.push_back((tenant, line));
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
            let line = &mut self.rotation[i].1;
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
        for (_, line) in self.rotation.iter_mut() {
            let mut kept = VecDeque::with_capacity(line.len());
            for item in line.drain(..) {
                if pred(&item) {
                    out.push(item);
                } else {
                    kept.push_back(item);
                }
            }
            *line = kept;
        }
        self.rotation.retain(|(_, line)| !line.is_empty());
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
            q.push(&t("flood"), format!("a{i}"));
        }
        q.push(&t("quiet"), "b0".to_string());
        q.push(&t("quiet"), "b1".to_string());
        assert_eq!(q.len(), 6);
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ["a0", "b0", "a1", "b1", "a2", "a3"]);
        assert!(q.is_empty());
    }

    #[test]
    fn removing_keeps_the_rest_in_order() {
        let mut q = FairQueue::new();
        q.push(&t("a"), 1);
        q.push(&t("b"), 2);
        q.push(&t("a"), 3);
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
