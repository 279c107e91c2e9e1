//! Per-request bookkeeping that must happen however the request ends: a concurrency slot (429
//! when none is free, the router's or the tenant's own), the in-flight gauge, and exactly one
//! `requests_total{outcome}` count — `cancelled` unless someone recorded another outcome before
//! the drop.

use std::collections::HashMap;
use std::sync::Arc;

use pagewarden_common::TenantId;
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::RouterError;
use crate::metrics::{Metrics, Outcome};
use crate::openai::Endpoint;

/// Each tenant's requests in flight, for the per-tenant limit.
#[derive(Debug, Default)]
pub struct TenantSlots {
    held: Mutex<HashMap<TenantId, usize>>,
}

/// One request's place under its tenant's limit; given back on drop.
struct TenantSlot {
    slots: Arc<TenantSlots>,
    tenant: TenantId,
}

impl TenantSlots {
    /// Takes a place for `tenant`, or fails with 429 when it has `limit` requests in flight.
    fn take(self: &Arc<Self>, tenant: &TenantId, limit: usize) -> Result<TenantSlot, RouterError> {
        let mut held = self.held.lock();
        let n = held.entry(tenant.clone()).or_default();
        if *n >= limit {
            return Err(RouterError::TenantOverloaded {
                tenant: tenant.as_str().to_string(),
                limit,
            });
        }
        *n += 1;
        Ok(TenantSlot {
            slots: self.clone(),
            tenant: tenant.clone(),
        })
    }
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock();
        if let Some(n) = held.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

/// The limits a request is admitted under.
pub struct Limits<'a> {
    /// The router's semaphore and its size.
    pub router: (&'a Arc<Semaphore>, usize),
    /// Every tenant's count, and this tenant's limit (`None`: no limit).
    pub tenant: (&'a Arc<TenantSlots>, &'a TenantId, Option<usize>),
}

/// A held slot of the router's concurrency limit (and of the tenant's own, when it has one).
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    _tenant: Option<TenantSlot>,
    metrics: Arc<Metrics>,
}

impl Slot {
    /// Takes a slot, or fails with 429 (`Retry-After`) when the tenant is at its own limit or
    /// the router at its limit. The tenant's limit is checked first: a tenant at its limit
    /// never takes a router slot from the others.
    pub fn acquire(limits: Limits<'_>, metrics: &Arc<Metrics>) -> Result<Self, RouterError> {
        let (slots, tenant, tenant_limit) = limits.tenant;
        let tenant_slot = tenant_limit
            .map(|limit| slots.take(tenant, limit))
            .transpose()?;
        let (limiter, limit) = limits.router;
        let permit = limiter
            .clone()
            .try_acquire_owned()
            .map_err(|_| RouterError::Overloaded(limit))?;
        metrics.in_flight.inc();
        Ok(Self {
            _permit: permit,
            _tenant: tenant_slot,
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
        RouterError::Worker { .. }
        | RouterError::EraseIncomplete { .. }
        | RouterError::Internal(_) => Outcome::Failed,
        RouterError::Unauthorized(_)
        | RouterError::PayloadTooLarge { .. }
        | RouterError::InvalidUtf8(_)
        | RouterError::InvalidJson(_)
        | RouterError::UnsupportedMediaType(_)
        | RouterError::Invalid(_)
        | RouterError::ModelNotFound(_)
        | RouterError::ContextLengthExceeded { .. }
        | RouterError::Overloaded(_)
        | RouterError::TenantOverloaded { .. }
        | RouterError::TokenRateExceeded { .. }
        | RouterError::NoLiveWorkers(_)
        | RouterError::PoolExhausted { .. }
        | RouterError::WorkerRejected { .. }
        | RouterError::NotFound(_)
        | RouterError::ApiNotServed(_)
        | RouterError::ReceiptsNotConfigured
        | RouterError::MethodNotAllowed(_) => Outcome::Rejected,
    }
}
