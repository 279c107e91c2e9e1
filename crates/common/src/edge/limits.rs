//! The edge's limits: deadlines that idle peers run into and caps they count against.

use std::time::Duration;

/// Limits of one HTTP listener's edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeLimits {
    /// Longest wait for one complete request head once its first byte arrived (HTTP/1).
    pub header_timeout: Duration,
    /// Longest wait for a complete request body, from the end of its head.
    pub body_timeout: Duration,
    /// Longest wait from accept to the first complete request (HTTP/1 and HTTP/2): a socket
    /// that sends nothing, or only a preface, is closed after it.
    pub first_request_timeout: Duration,
    /// Longest a kept-alive connection may sit with no request in flight.
    pub idle_timeout: Duration,
    /// How often an HTTP/2 connection is pinged.
    pub h2_ping_interval: Duration,
    /// How long an HTTP/2 ping may go unanswered before the connection is closed.
    pub h2_ping_timeout: Duration,
    /// Most connections open at once; past it the oldest idle or unauthenticated connection is
    /// closed for the new one (the new one is refused only when every connection is busy).
    pub max_connections: usize,
    /// Most connections with no request in flight (fresh or kept alive); past it the oldest goes.
    pub max_idle_connections: usize,
    /// Most connections one source address may hold before a request on them authenticates;
    /// past it that address's oldest idle unauthenticated connection goes.
    pub max_unauthenticated_per_addr: usize,
    /// Most connections authenticated as one principal (a tenant), from any address; past it
    /// that principal's oldest idle connection goes.
    pub max_connections_per_principal: usize,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        EdgeLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            first_request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            h2_ping_interval: Duration::from_secs(20),
            h2_ping_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_idle_connections: 512,
            max_unauthenticated_per_addr: 64,
            max_connections_per_principal: 128,
        }
    }
}

impl EdgeLimits {
    /// How often deadlines are checked: a small fraction of the shortest one, so a connection
    /// is closed within a few percent of its deadline.
    pub fn reap_every(&self) -> Duration {
        let shortest = self.first_request_timeout.min(self.idle_timeout);
        (shortest / 20).clamp(Duration::from_millis(5), Duration::from_millis(500))
    }
}
