//! The table of open connections and the choices made on it: which connection to close when a
//! cap is reached, and which have run past their deadline.
//!
//! One connection's phase:
//!
//! ```text
//! Fresh ──first request──▶ Busy{n} ──last response ends──▶ Idle ──request──▶ Busy{n}
//!   │                                                       │
//!   └── first_request_timeout / evicted ──▶ closed ◀── idle_timeout / evicted
//! ```
//!
//! A connection's principal is `None` until a request on it authenticates; an unauthenticated
//! connection counts against its source address, an authenticated one against its principal
//! (the tenant). Busy connections are never chosen for closing: only Fresh and Idle ones, the
//! oldest first, so that a peer cannot hold what others need by opening sockets and going quiet.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::limits::EdgeLimits;

/// Where one connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Accepted; no complete request yet.
    Fresh,
    /// `n` requests in flight (HTTP/2 may carry several).
    Busy(usize),
    /// Kept alive between requests.
    Idle,
}

impl Phase {
    fn closable(self) -> bool {
        match self {
            Phase::Fresh | Phase::Idle => true,
            Phase::Busy(_) => false,
        }
    }
}

/// Why the edge closed a connection (the `reason` label of the closed-connections count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// No complete request within `first_request_timeout` of accept.
    FirstRequestTimeout,
    /// Idle longer than `idle_timeout`.
    IdleTimeout,
    /// The connection cap was reached and a newer connection needed the place.
    MaxConnections,
    /// More idle connections than `max_idle_connections`.
    MaxIdle,
    /// Its source address held more unauthenticated connections than its cap.
    UnauthenticatedPerAddress,
    /// Its principal held more connections than its cap.
    PerPrincipal,
}

impl CloseReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::FirstRequestTimeout => "first_request_timeout",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::MaxConnections => "max_connections",
            CloseReason::MaxIdle => "max_idle_connections",
            CloseReason::UnauthenticatedPerAddress => "unauthenticated_per_address",
            CloseReason::PerPrincipal => "per_principal",
        }
    }
}

/// Why a new connection was refused: every place was held by a busy connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Every connection is busy and the cap is reached.
    MaxConnections,
    /// Every unauthenticated connection of this address is busy and its cap is reached.
    UnauthenticatedPerAddress,
}

impl Refusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::UnauthenticatedPerAddress => "unauthenticated_per_address",
        }
    }
}

/// A connection's key in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(u64);

#[derive(Debug)]
struct Entry {
    addr: IpAddr,
    principal: Option<Arc<str>>,
    phase: Phase,
    /// When `phase` was entered (ages for "oldest" and deadlines).
    since: Instant,
    close: CancellationToken,
}

/// Every open connection of one listener.
#[derive(Debug)]
pub struct Table {
    limits: EdgeLimits,
    next: u64,
    conns: HashMap<ConnId, Entry>,
}

/// Connections closed by one operation, with why (the caller counts them).
pub type Closed = Vec<CloseReason>;

impl Table {
    /// An empty table under `limits`.
    pub fn new(limits: EdgeLimits) -> Self {
        Table {
            limits,
            next: 0,
            conns: HashMap::new(),
        }
    }

    /// The phase of `id`, or `None` once it is closed.
    #[cfg(test)]
    pub fn phase(&self, id: ConnId) -> Option<Phase> {
        self.conns.get(&id).map(|e| e.phase)
    }

    /// Takes a new connection from `addr` in, closing the oldest closable connection where a cap
    /// would be passed; refuses it only when every connection in the way is busy.
    pub fn admit(
        &mut self,
        addr: IpAddr,
        now: Instant,
        closed: &mut Closed,
    ) -> Result<(ConnId, CancellationToken), Refusal> {
        let unauth_here = |e: &Entry| e.principal.is_none() && e.addr == addr;
        if self.count(unauth_here) >= self.limits.max_unauthenticated_per_addr
            && !self.close_oldest(unauth_here, CloseReason::UnauthenticatedPerAddress, closed)
        {
            return Err(Refusal::UnauthenticatedPerAddress);
        }
        if self.conns.len() >= self.limits.max_connections
            && !self.close_oldest(|_| true, CloseReason::MaxConnections, closed)
        {
            return Err(Refusal::MaxConnections);
        }
        let id = ConnId(self.next);
        self.next += 1;
        let close = CancellationToken::new();
        self.conns.insert(
            id,
            Entry {
                addr,
                principal: None,
                phase: Phase::Fresh,
                since: now,
                close: close.clone(),
            },
        );
        self.enforce_idle_cap(closed);
        Ok((id, close))
    }

    /// A request on `id` began.
    pub fn begin(&mut self, id: ConnId, now: Instant) {
        if let Some(e) = self.conns.get_mut(&id) {
            e.phase = match e.phase {
                Phase::Fresh | Phase::Idle => Phase::Busy(1),
                Phase::Busy(n) => Phase::Busy(n + 1),
            };
            e.since = now;
        }
    }

    /// A request on `id` ended (its response body finished or was dropped).
    pub fn end(&mut self, id: ConnId, now: Instant, closed: &mut Closed) {
        let Some(e) = self.conns.get_mut(&id) else {
            return;
        };
        e.phase = match e.phase {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            Phase::Busy(_) | Phase::Fresh | Phase::Idle => Phase::Idle,
        };
        e.since = now;
        let principal = e.principal.clone();
        if let Some(p) = principal {
            self.enforce_principal_cap(&p, closed);
        }
        self.enforce_idle_cap(closed);
    }

    /// A request on `id` carried valid credentials of `principal`: the connection leaves its
    /// address's unauthenticated count and joins `principal`'s. The first principal stays.
    pub fn authenticated(&mut self, id: ConnId, principal: &str, closed: &mut Closed) {
        let Some(e) = self.conns.get_mut(&id) else {
            return;
        };
        if e.principal.is_some() {
            return;
        }
        let p: Arc<str> = principal.into();
        e.principal = Some(p.clone());
        self.enforce_principal_cap(&p, closed);
    }

    /// The connection ended on its own.
    pub fn remove(&mut self, id: ConnId) {
        self.conns.remove(&id);
    }

    /// Closes every connection past its deadline at `now`.
    pub fn reap(&mut self, now: Instant, closed: &mut Closed) {
        let limits = self.limits;
        let expired: Vec<(ConnId, CloseReason)> = self
            .conns
            .iter()
            .filter_map(|(id, e)| {
                let age = now.saturating_duration_since(e.since);
                match e.phase {
                    Phase::Fresh if age >= limits.first_request_timeout => {
                        Some((*id, CloseReason::FirstRequestTimeout))
                    }
                    Phase::Idle if age >= limits.idle_timeout => {
                        Some((*id, CloseReason::IdleTimeout))
                    }
                    Phase::Fresh | Phase::Idle | Phase::Busy(_) => None,
                }
            })
            .collect();
        for (id, why) in expired {
            self.close(id, why, closed);
        }
    }

    fn count(&self, pred: impl Fn(&Entry) -> bool) -> usize {
        self.conns.values().filter(|e| pred(e)).count()
    }

    /// Closes the oldest closable connection matching `pred`; false when there is none.
    fn close_oldest(
        &mut self,
        pred: impl Fn(&Entry) -> bool,
        why: CloseReason,
        closed: &mut Closed,
    ) -> bool {
        let oldest = self
            .conns
            .iter()
            .filter(|(_, e)| e.phase.closable() && pred(e))
            // Unauthenticated before authenticated, then the longest in its phase.
            .min_by_key(|(id, e)| (e.principal.is_some(), e.since, **id))
            .map(|(id, _)| *id);
        match oldest {
            Some(id) => {
                self.close(id, why, closed);
                true
            }
            None => false,
        }
    }

    fn enforce_principal_cap(&mut self, principal: &Arc<str>, closed: &mut Closed) {
        let mine = |e: &Entry| e.principal.as_deref() == Some(&**principal);
        while self.count(mine) > self.limits.max_connections_per_principal {
            if !self.close_oldest(mine, CloseReason::PerPrincipal, closed) {
                break;
            }
        }
    }

    fn enforce_idle_cap(&mut self, closed: &mut Closed) {
        let idle = |e: &Entry| e.phase.closable();
        while self.count(idle) > self.limits.max_idle_connections {
            if !self.close_oldest(idle, CloseReason::MaxIdle, closed) {
                break;
            }
        }
    }

    fn close(&mut self, id: ConnId, why: CloseReason, closed: &mut Closed) {
        if let Some(e) = self.conns.remove(&id) {
            e.close.cancel();
            closed.push(why);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use super::*;

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

    fn limits() -> EdgeLimits {
        EdgeLimits {
            max_connections: 4,
            max_idle_connections: 4,
            max_unauthenticated_per_addr: 2,
            max_connections_per_principal: 2,
            first_request_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(5),
            ..EdgeLimits::default()
        }
    }

    #[test]
    fn an_address_past_its_cap_loses_its_oldest_unauthenticated_socket() {
        let mut t = Table::new(limits());
        let now = Instant::now();
        let mut closed = Vec::new();
        let (a1, tok1) = t.admit(A, now, &mut closed).unwrap();
        let (a2, _) = t
            .admit(A, now + Duration::from_millis(1), &mut closed)
            .unwrap();
        let (b1, _) = t.admit(B, now, &mut closed).unwrap();
        let (a3, _) = t
            .admit(A, now + Duration::from_millis(2), &mut closed)
            .unwrap();
        assert_eq!(closed, vec![CloseReason::UnauthenticatedPerAddress]);
        assert!(tok1.is_cancelled(), "the oldest of A was closed");
        assert_eq!(t.phase(a1), None);
        for id in [a2, b1, a3] {
            assert_eq!(t.phase(id), Some(Phase::Fresh), "the others stay");
        }
    }

    #[test]
    fn busy_connections_are_never_closed_and_the_new_one_is_refused_then() {
        let mut t = Table::new(limits());
        let now = Instant::now();
        let mut closed = Vec::new();
        let (a1, _) = t.admit(A, now, &mut closed).unwrap();
        let (a2, _) = t.admit(A, now, &mut closed).unwrap();
        t.begin(a1, now);
        t.begin(a2, now);
        assert_eq!(
            t.admit(A, now, &mut closed).unwrap_err(),
            Refusal::UnauthenticatedPerAddress
        );
        assert!(closed.is_empty());
        // An authenticated connection leaves the address's count.
        t.authenticated(a1, "alice", &mut closed);
        assert!(t.admit(A, now, &mut closed).is_ok());
    }

    #[test]
    fn at_the_connection_cap_the_oldest_idle_goes_unauthenticated_first() {
        let mut t = Table::new(limits());
        let now = Instant::now();
        let mut closed = Vec::new();
        let (old_auth, tok) = t.admit(A, now, &mut closed).unwrap();
        t.begin(old_auth, now);
        t.authenticated(old_auth, "alice", &mut closed);
        t.end(old_auth, now, &mut closed);
        let (busy, _) = t.admit(B, now, &mut closed).unwrap();
        t.begin(busy, now);
        let (fresh, ftok) = t
            .admit(B, now + Duration::from_secs(1), &mut closed)
            .unwrap();
        let (_, _) = t
            .admit(A, now + Duration::from_secs(1), &mut closed)
            .unwrap();
        assert!(closed.is_empty());
        let (_, _) = t
            .admit(A, now + Duration::from_secs(2), &mut closed)
            .unwrap();
        assert_eq!(closed, vec![CloseReason::MaxConnections]);
        assert!(ftok.is_cancelled(), "the oldest unauthenticated one went");
        assert!(!tok.is_cancelled(), "the authenticated idle one stayed");
        assert_eq!(t.phase(fresh), None);
        assert_eq!(t.phase(busy), Some(Phase::Busy(1)));
    }

    #[test]
    fn a_principal_past_its_cap_loses_its_oldest_idle_connection() {
        let mut t = Table::new(limits());
        let now = Instant::now();
        let mut closed = Vec::new();
        let mut ids = Vec::new();
        for i in 0..3 {
            let at = now + Duration::from_millis(i);
            let (id, tok) = t
                .admit(
                    IpAddr::V4(Ipv4Addr::new(10, 1, 0, i as u8)),
                    at,
                    &mut closed,
                )
                .unwrap();
            t.begin(id, at);
            t.authenticated(id, "alice", &mut closed);
            t.end(id, at, &mut closed);
            ids.push((id, tok));
        }
        assert_eq!(closed, vec![CloseReason::PerPrincipal]);
        assert!(ids[0].1.is_cancelled());
        assert!(!ids[1].1.is_cancelled() && !ids[2].1.is_cancelled());
    }

    #[test]
    fn deadlines_close_fresh_and_idle_but_not_busy_connections() {
        let mut t = Table::new(limits());
        let now = Instant::now();
        let mut closed = Vec::new();
        let (fresh, _) = t.admit(A, now, &mut closed).unwrap();
        let (idle, _) = t.admit(B, now, &mut closed).unwrap();
        t.begin(idle, now);
        t.end(idle, now, &mut closed);
        let (busy, _) = t.admit(B, now, &mut closed).unwrap();
        t.begin(busy, now);
        t.reap(now + Duration::from_millis(999), &mut closed);
        assert!(closed.is_empty());
        t.reap(now + Duration::from_secs(1), &mut closed);
        assert_eq!(closed, vec![CloseReason::FirstRequestTimeout]);
        assert_eq!(t.phase(fresh), None);
        t.reap(now + Duration::from_secs(60), &mut closed);
        assert_eq!(closed.len(), 2);
        assert_eq!(closed[1], CloseReason::IdleTimeout);
        assert_eq!(t.phase(busy), Some(Phase::Busy(1)));
    }
}
