//! The router's one seam to the disaggregated workers. [`Disagg`] says how long a request may
//! be (the effective context) and dispatches one choice of a request, whose tokens come from
//! the [`Generation`] it returns; a generation dropped before its end aborts whatever it holds.
//!
//! [`GrpcDisagg`] is the suite's: each choice a [`Flight`] (decode's `Reserve`, prefill's
//! `Prefill`, decode's `Generate`, the abort guard) over the worker pool, and a tenant's
//! cache erasure on every worker ([`crate::erasure`]). Tests serve the
//! router over [`InMemoryDisagg`](crate::in_memory::InMemoryDisagg) instead: no gRPC server, no
//! model.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use pagewarden_common::namespace::Namespace;
use pagewarden_common::{RequestId, TenantId};

use crate::dispatch::{DispatchConfig, Flight, Job, Token};
use crate::erasure::{erase_everywhere, WorkerErasure};
use crate::error::RouterError;
use crate::metrics::Metrics;
use crate::provenance::Provenance;
use crate::workers::WorkerPool;

/// Where a request's choices are served.
pub trait Disagg: Send + Sync {
    /// The context a prompt and its completion must fit in now (an error while no worker of a
    /// half is live).
    fn effective_context(&self) -> Result<u32, RouterError>;

    /// Dispatches one choice. Sends nothing yet: the first [`Generation::next`] does.
    fn dispatch(&self, job: Job) -> Result<Box<dyn Generation>, RouterError>;

    /// Erases `tenant`'s `namespace` from every worker's prefix cache; each worker's part of
    /// the certificate, or an error naming a worker that did not confirm.
    fn erase_cache<'a>(
        &'a self,
        tenant: &'a TenantId,
        namespace: Namespace,
    ) -> BoxFuture<'a, Result<Vec<WorkerErasure>, RouterError>>;
}

/// One dispatched choice.
pub trait Generation: Send {
    /// Its next token; `None` after the last one (which carries the finish reason) or after
    /// an error.
    fn next(&mut self) -> BoxFuture<'_, Option<Result<Token, RouterError>>>;

    /// What it cost and took, so far.
    fn summary(&self) -> Summary;
}

/// A choice's account: the ids it ran under, its tokens and its time to first token.
#[derive(Clone, Debug)]
pub struct Summary {
    /// The request id the workers saw.
    pub id: RequestId,
    /// Who asked.
    pub tenant: TenantId,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Of them, those whose KV came from the prefix cache.
    pub cached_tokens: u32,
    /// Completion tokens relayed.
    pub completion_tokens: u32,
    /// When the HTTP request arrived.
    pub arrived: Instant,
    /// Time to first token, once there was one.
    pub ttft: Option<Duration>,
    /// From arrival to decode's grant: when the request left the queue and began to run.
    pub scheduled: Option<Duration>,
    /// From arrival to the last token, once there was one.
    pub last_token: Option<Duration>,
    /// What it was computed over, as its workers reported it.
    pub provenance: Provenance,
}

/// The suite's workers over gRPC.
pub struct GrpcDisagg {
    pool: Arc<WorkerPool>,
    cfg: DispatchConfig,
    metrics: Arc<Metrics>,
}

impl GrpcDisagg {
    /// Dispatches over `pool` with `cfg`'s timeouts, counting into `metrics`.
    pub fn new(pool: Arc<WorkerPool>, cfg: DispatchConfig, metrics: Arc<Metrics>) -> Self {
        Self { pool, cfg, metrics }
    }
}

impl Disagg for GrpcDisagg {
    fn effective_context(&self) -> Result<u32, RouterError> {
        self.pool.effective_context()
    }

    fn dispatch(&self, job: Job) -> Result<Box<dyn Generation>, RouterError> {
        let flight = Flight::start(&self.pool, self.cfg, self.metrics.clone(), job)?;
        Ok(Box::new(flight))
    }

    fn erase_cache<'a>(
        &'a self,
        tenant: &'a TenantId,
        namespace: Namespace,
    ) -> BoxFuture<'a, Result<Vec<WorkerErasure>, RouterError>> {
        Box::pin(async move { erase_everywhere(&self.pool, tenant, &namespace).await })
    }
}

impl Generation for Flight {
    fn next(&mut self) -> BoxFuture<'_, Option<Result<Token, RouterError>>> {
        Box::pin(Flight::next(self))
    }

    fn summary(&self) -> Summary {
        Summary {
            id: self.id(),
            tenant: self.tenant().clone(),
            prompt_tokens: self.prompt_tokens(),
            cached_tokens: self.usage().prompt_tokens_details.cached_tokens,
            completion_tokens: self.completion_tokens(),
            arrived: self.arrived(),
            ttft: self.ttft(),
            scheduled: self.scheduled(),
            last_token: self.last_token(),
            provenance: self.provenance().clone(),
        }
    }
}
