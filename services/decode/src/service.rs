//! The `Decode` gRPC service: parses each call, hands it to the scheduler, maps the reply.

use std::pin::Pin;
use std::sync::Arc;
use tokio::time::Instant;

use pagewarden_common::admission::Admission;
use pagewarden_common::telemetry::accept_trace_context;
use pagewarden_common::TenantId;
use pagewarden_kvcache::KvPool;
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::decode_server::Decode;
use pagewarden_transfer::SealPolicy;
use pagewarden_worker::wire as convert;
use pagewarden_worker::WorkerError;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::scheduler::{Command, Load};
use crate::state::{GenerateArgs, Granted};

/// What `Info` reports besides live figures.
pub struct Static {
    pub node_id: String,
    pub model: String,
    pub admission: Admission,
    pub page_size: usize,
    /// The forward pass's arithmetic (see `Model::arithmetic`).
    pub arithmetic: String,
    pub transfer_addr: String,
}

/// The service.
pub struct DecodeService {
    pub tx: mpsc::Sender<Command>,
    pub pool: KvPool,
    pub info: Arc<Static>,
    /// The transfer listener's seal: each grant carries its secret when set.
    pub seal: Option<SealPolicy>,
}

impl DecodeService {
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, Status> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::TokenEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Decode for DecodeService {
    async fn reserve(
        &self,
        request: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveReply>, Status> {
        let span = tracing::info_span!("decode.reserve");
        accept_trace_context(&span, request.metadata());
        // The span is attached to the future, never entered across an await (a guard held over
        // an await leaves a closed span on the thread's stack: tracing-subscriber then panics).
        async move {
            let m = request.into_inner();
            let (req, attempt) = pagewarden_proto::convert::parse_request_ref(m.req.as_ref())?;
            if m.tenant.is_empty() {
                return Err(Status::invalid_argument("tenant is required"));
            }
            let sampling = pagewarden_proto::convert::sampling(m.sampling.as_ref())?;
            let prompt = convert::prompt_ids(m.prompt_token_ids, m.prompt_tokens as usize)?;
            let namespace = convert::namespace(&m.namespace)?;
            // The call may wait in the scheduler's queue; if it is dropped meanwhile (the router
            // gave up), the request leaves the queue at once.
            let withdraw = Withdraw {
                tx: self.tx.clone(),
                req,
                attempt,
                armed: true,
            };
            let grant = self
                .ask(|reply| Command::Reserve {
                    req,
                    attempt,
                    tenant: TenantId::new(m.tenant),
                    weight: m.tenant_weight.max(1),
                    prompt,
                    sampling: Box::new(sampling),
                    namespace,
                    reply,
                })
                .await?;
            withdraw.disarm();
            let Granted {
                grant,
                prefix_tokens,
            } = grant?;
            Ok(Response::new(pb::ReserveReply {
                req: m.req,
                grant: Some(convert::grant(
                    &grant,
                    prefix_tokens,
                    &self.info.transfer_addr,
                    self.seal
                        .as_ref()
                        .map(|p| p.master.grant(p.mode, grant.key))
                        .as_ref(),
                )),
            }))
        }
        .instrument(span)
        .await
    }

    type GenerateStream = EventStream;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let received_at = Instant::now();
        let span = tracing::info_span!("decode.generate");
        accept_trace_context(&span, request.metadata());
        async move {
            let m = request.into_inner();
            let (req, attempt) = pagewarden_proto::convert::parse_request_ref(m.req.as_ref())?;
            let manifest = convert::manifest(m.manifest.as_ref())?;
            let (tx, rx) = mpsc::unbounded_channel();
            let args = GenerateArgs {
                manifest,
                first_token: m.first_token,
                first_logprobs: convert::parse_logprobs(m.first_logprobs.as_ref())?,
                tx,
                received_at,
            };
            self.ask(|reply| Command::Generate {
                req,
                attempt,
                args,
                reply,
            })
            .await??;
            let events: EventStream = Box::pin(UnboundedReceiverStream::new(rx));
            Ok(Response::new(events))
        }
        .instrument(span)
        .await
    }

    async fn abort(
        &self,
        request: Request<pb::AbortRequest>,
    ) -> Result<Response<pb::AbortReply>, Status> {
        let m = request.into_inner();
        let (req, attempt) = pagewarden_proto::convert::parse_request_ref(m.req.as_ref())?;
        let found = self
            .ask(|reply| Command::Abort {
                req,
                attempt,
                reason: m.reason,
                reply,
            })
            .await?;
        Ok(Response::new(pb::AbortReply { found }))
    }

    async fn erase_cache(
        &self,
        request: Request<pb::EraseCacheRequest>,
    ) -> Result<Response<pb::EraseCacheReply>, Status> {
        let (tenant, namespace) = convert::erase_request(request.into_inner())?;
        let erasure = self
            .ask(|reply| Command::EraseCache {
                tenant,
                namespace,
                reply,
            })
            .await?;
        Ok(Response::new(convert::erase_reply(
            &self.info.node_id,
            "decode",
            &erasure,
        )))
    }

    async fn info(
        &self,
        _request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::WorkerInfo>, Status> {
        let Load {
            active,
            queued,
            draining,
        } = self.ask(|reply| Command::Load { reply }).await?;
        if draining {
            // The router marks this decode down and sends it nothing new.
            return Err(Status::unavailable("decode is draining"));
        }
        Ok(Response::new(pb::WorkerInfo {
            node_id: self.info.node_id.clone(),
            role: "decode".into(),
            model: self.info.model.clone(),
            context_length: self.info.admission.advertised_context() as u32,
            pool_tokens: self.pool.capacity_tokens() as u64,
            page_size: self.info.page_size as u32,
            // Cached prefix pages nobody reads are free to any allocation.
            free_pages: self.pool.available_pages() as u64,
            total_pages: self.pool.capacity_pages() as u64,
            active_requests: active as u32,
            transfer_addr: self.info.transfer_addr.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            arithmetic: self.info.arithmetic.clone(),
            queue_depth: queued as u32,
        }))
    }
}

/// Sends [`Command::Withdraw`] when a `Reserve` call is dropped before its answer arrived.
struct Withdraw {
    tx: mpsc::Sender<Command>,
    req: pagewarden_common::RequestId,
    attempt: pagewarden_common::AttemptId,
    armed: bool,
}

impl Withdraw {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.tx.try_send(Command::Withdraw {
                req: self.req,
                attempt: self.attempt,
            });
        }
    }
}

/// The scheduler task is gone (the worker is stopping).
fn stopped() -> Status {
    WorkerError::Unavailable("decode scheduler stopped".into()).into()
}
