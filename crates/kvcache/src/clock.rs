//! `Clock`: the pool's one source of time, for when a grant was issued, last written and
//! revoked, and so for its idle lifetime and drain timeout. The wall clock in service; a
//! [`ManualClock`] in tests, which moves only when told, so a lifetime is tested without
//! sleeping.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Where the pool reads the time.
pub trait Clock: Debug + Send + Sync {
    /// Now.
    fn now(&self) -> Instant;
}

/// The monotonic wall clock (`Instant::now`): the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until [`ManualClock::advance`]; clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<Instant>>);

impl ManualClock {
    /// A clock at the wall clock's now.
    pub fn new() -> Self {
        Self(Arc::new(Mutex::new(Instant::now())))
    }

    /// Moves the time forward by `d`.
    pub fn advance(&self, d: Duration) {
        *self.0.lock() += d;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.0.lock()
    }
}
