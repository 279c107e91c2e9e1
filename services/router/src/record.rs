//! Per-request bookkeeping that must happen however the request ends: a concurrency slot (429
//! when none is free), the in-flight gauge, and exactly one `requests_total{outcome}` count —
//! `cancelled` unless someone recorded another outcome before the drop.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::RouterError;
use crate::metrics::{Metrics, Outcome};
use crate::openai::Endpoint;

/// A held slot of the router's concurrency limit.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Slot {
    /// Takes a slot, or fails with 429 (`Retry-After`) when all `limit` are taken.
    pub fn acquire(
        limiter: &Arc<Semaphore>,
        limit: usize,
        metrics: &Arc<Metrics>,
    ) -> Result<Self, RouterError> {
        let permit = limiter
            .clone()
            .try_acquire_owned()
            .map_err(|_| RouterError::Overloaded(limit))?;
        metrics.in_flight.inc();
        Ok(Self {
            _permit: permit,
            metrics: metrics.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

/// Records the request's outcome once, on drop.
pub struct Record {
    endpoint: Endpoint,
    metrics: Arc<Metrics>,
    outcome: Outcome,
}

impl Record {
    /// A record that says `cancelled` unless told otherwise.
    pub fn new(endpoint: Endpoint, metrics: Arc<Metrics>) -> Self {
        Self {
            endpoint,
            metrics,
            outcome: Outcome::Cancelled,
        }
    }

    /// Sets the outcome to report.
    pub fn set(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }

    /// Sets the outcome from an error, counting a rejection when it is one.
    pub fn fail(&mut self, e: &RouterError) {
        self.outcome = outcome_of(e);
        if self.outcome == Outcome::Rejected {
            self.metrics.reject(e.reason());
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.metrics.request(self.endpoint.as_str(), self.outcome);
    }
}

/// Errors the client caused or capacity refusals are rejections; deadlines are timeouts; the
/// rest are failures.
pub fn outcome_of(e: &RouterError) -> Outcome {
    match e {
        RouterError::Timeout(_) => Outcome::TimedOut,
        RouterError::Worker { .. } | RouterError::Internal(_) => Outcome::Failed,
        RouterError::Unauthorized(_)
        | RouterError::PayloadTooLarge { .. }
        | RouterError::InvalidUtf8(_)
        | RouterError::InvalidJson(_)
        | RouterError::Invalid(_)
        | RouterError::ModelNotFound(_)
        | RouterError::ContextLengthExceeded { .. }
        | RouterError::Overloaded(_)
        | RouterError::NoLiveWorkers(_)
        | RouterError::PoolExhausted { .. }
        | RouterError::WorkerRejected { .. }
        | RouterError::NotFound(_)
        | RouterError::MethodNotAllowed(_) => Outcome::Rejected,
    }
}
