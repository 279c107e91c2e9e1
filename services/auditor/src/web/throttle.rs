//! Sign-in back-off, per client address and per account name: after `free` failures in a row,
//! each further failure doubles the wait (from one second, up to `max_backoff`) before either
//! may try again. A blocked attempt is answered 429 without hashing its password, so a flood
//! of guesses costs the auditor neither CPU nor memory; a success clears both keys.
//!
//! The table is bounded: past `MAX_KEYS` the entry idle longest is forgotten (the worst that
//! does is let a forgotten key start again from its free failures).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Keys kept at most.
const MAX_KEYS: usize = 10_000;

/// Back-off settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThrottleLimits {
    /// Failures in a row allowed before any wait.
    pub free: u32,
    /// Longest wait after a failure.
    pub max_backoff: Duration,
}

impl Default for ThrottleLimits {
    fn default() -> Self {
        ThrottleLimits {
            free: 5,
            max_backoff: Duration::from_secs(300),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Addr(IpAddr),
    User(String),
}

#[derive(Clone, Copy, Debug)]
struct Failures {
    count: u32,
    blocked_until: Instant,
    last: Instant,
}

/// Sign-in failures by address and by name.
#[derive(Debug, Default)]
pub struct Throttle {
    limits: ThrottleLimits,
    table: Mutex<HashMap<Key, Failures>>,
}

impl Throttle {
    /// An empty table under `limits`.
    pub fn new(limits: ThrottleLimits) -> Self {
        Throttle {
            limits,
            table: Mutex::new(HashMap::new()),
        }
    }

    fn keys(addr: Option<IpAddr>, name: &str) -> impl Iterator<Item = Key> {
        addr.map(Key::Addr)
            .into_iter()
            .chain(std::iter::once(Key::User(name.to_string())))
    }

    /// How long `addr` or `name` must still wait before a try, or `None` when it may try now.
    pub fn wait(&self, addr: Option<IpAddr>, name: &str, now: Instant) -> Option<Duration> {
        let table = self.table.lock();
        Self::keys(addr, name)
            .filter_map(|k| table.get(&k))
            .map(|f| f.blocked_until.saturating_duration_since(now))
            .filter(|d| !d.is_zero())
            .max()
    }

    /// A try of `name` from `addr` failed.
    pub fn failed(&self, addr: Option<IpAddr>, name: &str, now: Instant) {
        let mut table = self.table.lock();
        for k in Self::keys(addr, name) {
            if !table.contains_key(&k) && table.len() >= MAX_KEYS {
                if let Some(stale) = table
                    .iter()
                    .min_by_key(|(_, f)| f.last)
                    .map(|(k, _)| k.clone())
                {
                    table.remove(&stale);
                }
            }
            let f = table.entry(k).or_insert(Failures {
                count: 0,
                blocked_until: now,
                last: now,
            });
            f.count = f.count.saturating_add(1);
            f.last = now;
            if let Some(over) = f.count.checked_sub(self.limits.free).filter(|n| *n > 0) {
                let wait = Duration::from_secs(1)
                    .saturating_mul(1u32 << (over - 1).min(20))
                    .min(self.limits.max_backoff);
                f.blocked_until = now + wait;
            }
        }
    }

    /// A try of `name` from `addr` succeeded: both start again.
    pub fn succeeded(&self, addr: Option<IpAddr>, name: &str) {
        let mut table = self.table.lock();
        for k in Self::keys(addr, name) {
            table.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const A: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
    const B: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));

    #[test]
    fn failures_past_the_free_ones_back_off_doubling_per_address_and_per_name() {
        let t = Throttle::new(ThrottleLimits {
            free: 2,
            max_backoff: Duration::from_secs(4),
        });
        let now = Instant::now();
        t.failed(A, "op", now);
        t.failed(A, "op", now);
        assert_eq!(t.wait(A, "op", now), None, "free failures");
        t.failed(A, "op", now);
        assert_eq!(t.wait(A, "op", now), Some(Duration::from_secs(1)));
        assert_eq!(
            t.wait(B, "op", now),
            Some(Duration::from_secs(1)),
            "the name is blocked from another address too"
        );
        assert_eq!(
            t.wait(A, "other", now),
            Some(Duration::from_secs(1)),
            "the address is blocked for another name too"
        );
        assert_eq!(t.wait(B, "other", now), None);
        t.failed(A, "op", now);
        assert_eq!(t.wait(A, "op", now), Some(Duration::from_secs(2)));
        for _ in 0..10 {
            t.failed(A, "op", now);
        }
        assert_eq!(t.wait(A, "op", now), Some(Duration::from_secs(4)), "capped");
        assert_eq!(t.wait(A, "op", now + Duration::from_secs(4)), None);
        t.succeeded(A, "op");
        t.failed(A, "op", now);
        assert_eq!(t.wait(A, "op", now), None, "a success starts again");
    }
}
