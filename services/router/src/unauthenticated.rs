//! Connections that have not yet shown a valid API key, counted per client address: one address
//! may hold at most `cap` of them, so a single host cannot fill the edge's connection cap with
//! sockets that never authenticate, while clients behind one address that do authenticate (a
//! proxy, a NAT) keep any number of kept-alive connections.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// Per-address counts of unauthenticated connections.
#[derive(Debug)]
pub struct Unauthenticated {
    cap: usize,
    counts: Mutex<HashMap<IpAddr, usize>>,
}

impl Unauthenticated {
    /// At most `cap` unauthenticated connections per address.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            counts: Mutex::new(HashMap::new()),
        })
    }

    /// Counts a new connection from `addr`, or `None` when that address already holds `cap`.
    pub fn admit(self: &Arc<Self>, addr: IpAddr) -> Option<Pending> {
        let mut counts = self.counts.lock();
        let n = counts.entry(addr).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(Pending(Arc::new(PendingInner {
            gate: self.clone(),
            addr,
            done: AtomicBool::new(false),
        })))
    }

    /// Unauthenticated connections now held by `addr`.
    pub fn held(&self, addr: IpAddr) -> usize {
        self.counts.lock().get(&addr).copied().unwrap_or(0)
    }

    fn release(&self, addr: IpAddr) {
        let mut counts = self.counts.lock();
        if let Some(n) = counts.get_mut(&addr) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&addr);
            }
        }
    }
}

/// One connection's place in its address's count, carried as a request extension: it leaves the
/// count when a request on the connection authenticates, or when the connection closes.
#[derive(Clone, Debug)]
pub struct Pending(Arc<PendingInner>);

#[derive(Debug)]
struct PendingInner {
    gate: Arc<Unauthenticated>,
    addr: IpAddr,
    done: AtomicBool,
}

impl Pending {
    /// A request on this connection carried a valid key: the connection no longer counts.
    pub fn authenticated(&self) {
        self.0.leave();
    }
}

impl PendingInner {
    fn leave(&self) {
        if !self.done.swap(true, Ordering::AcqRel) {
            self.gate.release(self.addr);
        }
    }
}

impl Drop for PendingInner {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn an_address_holds_at_most_cap_and_others_are_unaffected() {
        let gate = Unauthenticated::new(2);
        let a1 = gate.admit(A).expect("first");
        let _a2 = gate.admit(A).expect("second");
        assert!(gate.admit(A).is_none(), "third from the same address");
        assert!(
            gate.admit(B).is_some(),
            "another address is not capped by A"
        );
        drop(a1);
        assert!(
            gate.admit(A).is_some(),
            "a closed connection frees its place"
        );
    }

    #[test]
    fn an_authenticated_connection_leaves_the_count_once() {
        let gate = Unauthenticated::new(1);
        let a = gate.admit(A).expect("first");
        let copy = a.clone();
        a.authenticated();
        a.authenticated();
        assert_eq!(gate.held(A), 0);
        let _b = gate
            .admit(A)
            .expect("the authenticated one no longer counts");
        drop(copy);
        drop(a);
        assert_eq!(
            gate.held(A),
            1,
            "dropping an authenticated one releases nothing more"
        );
    }
}
