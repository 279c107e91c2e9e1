//! Fake decode and prefill workers: real tonic servers on 127.0.0.1:0 implementing the generated
//! traits, recording every call, with knobs for failures, hangs and stale messages.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use pagewarden_proto::v1::decode_server::{Decode, DecodeServer};
use pagewarden_proto::v1::prefill_server::{Prefill, PrefillServer};
use pagewarden_proto::v1::{
    AbortReply, AbortRequest, CommitManifest, EraseCacheReply, EraseCacheRequest, FinishReason,
    GenerateRequest, GrantPage, InfoRequest, Logprobs, PrefillReply, PrefillRequest, RequestRef,
    ReserveReply, ReserveRequest, TokenEvent, TokenLogprob, WorkerInfo, WriteGrant,
};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// What a fake advertises and how it misbehaves.
#[derive(Clone, Debug)]
pub struct FakeOpts {
    pub context_length: u32,
    pub pool_tokens: u64,
    pub active_requests: u32,
    /// Advertised in `Info`.
    pub queue_depth: u32,
    /// Decode: emit this many tokens then hang until aborted (None: emit max_tokens and finish).
    pub hang_after: Option<usize>,
    /// Decode: emit this many tokens then an end-of-generation marker (finish STOP).
    pub eog_after: Option<usize>,
    /// Decode: first emit one event naming another request.
    pub stale_event: bool,
    /// Reserve (decode) / Prefill (prefill) fails with this status.
    pub fail: Option<tonic::Code>,
    /// Prefill: hang instead of answering.
    pub hang_prefill: bool,
    /// Info fails.
    pub info_fails: bool,
    /// Decode: the reply's token texts, then an end-of-generation marker (finish STOP), in
    /// place of `fake_text` (`max_tokens` still cuts it, finish LENGTH).
    pub script: Option<Vec<String>>,
    /// EraseCache fails with this status.
    pub fail_erase: Option<tonic::Code>,
}

impl Default for FakeOpts {
    fn default() -> Self {
        Self {
            context_length: 256,
            pool_tokens: 1024,
            active_requests: 0,
            queue_depth: 0,
            hang_after: None,
            eog_after: None,
            stale_event: false,
            fail: None,
            hang_prefill: false,
            info_fails: false,
            script: None,
            fail_erase: None,
        }
    }
}

/// Everything a fake saw.
#[derive(Default, Debug)]
pub struct Calls {
    pub reserve: Vec<ReserveRequest>,
    pub prefill: Vec<PrefillRequest>,
    pub generate: Vec<GenerateRequest>,
    pub abort: Vec<AbortRequest>,
    pub erase: Vec<EraseCacheRequest>,
    pub info: usize,
}

/// A running fake.
#[derive(Clone)]
pub struct Fake {
    pub addr: SocketAddr,
    pub calls: Arc<Mutex<Calls>>,
    pub opts: Arc<Mutex<FakeOpts>>,
}

impl Fake {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn reserves(&self) -> usize {
        self.calls.lock().reserve.len()
    }
    pub fn prefills(&self) -> usize {
        self.calls.lock().prefill.len()
    }
    pub fn erasures(&self) -> Vec<EraseCacheRequest> {
        self.calls.lock().erase.clone()
    }
    pub fn aborts(&self) -> Vec<AbortRequest> {
        self.calls.lock().abort.clone()
    }
    /// Waits up to 5 s for the first abort.
    pub async fn wait_abort(&self) -> Option<AbortRequest> {
        pagewarden_testkit::poll_until(Duration::from_secs(5), || async {
            self.aborts().into_iter().next()
        })
        .await
    }
}

#[derive(Clone)]
struct Inner {
    role: &'static str,
    calls: Arc<Mutex<Calls>>,
    opts: Arc<Mutex<FakeOpts>>,
}

impl Inner {
    fn info(&self) -> Result<Response<WorkerInfo>, Status> {
        let o = self.opts.lock().clone();
        self.calls.lock().info += 1;
        if o.info_fails {
            return Err(Status::unavailable("info disabled"));
        }
        Ok(Response::new(WorkerInfo {
            node_id: format!("fake-{}", self.role),
            role: self.role.into(),
            model: "tiny".into(),
            context_length: o.context_length,
            pool_tokens: o.pool_tokens,
            page_size: 16,
            free_pages: o.pool_tokens / 16,
            total_pages: o.pool_tokens / 16,
            active_requests: o.active_requests,
            transfer_addr: "127.0.0.1:1".into(),
            version: "test".into(),
            queue_depth: o.queue_depth,
            arithmetic: "fake".into(),
        }))
    }

    fn abort(&self, req: Request<AbortRequest>) -> Result<Response<AbortReply>, Status> {
        self.calls.lock().abort.push(req.into_inner());
        Ok(Response::new(AbortReply { found: true }))
    }

    /// Erases "3 pages, 1 still read" whatever the namespace, unless told to fail.
    fn erase(&self, req: Request<EraseCacheRequest>) -> Result<Response<EraseCacheReply>, Status> {
        self.calls.lock().erase.push(req.into_inner());
        if let Some(code) = self.opts.lock().fail_erase {
            return Err(Status::new(code, "fake erase fails"));
        }
        Ok(Response::new(EraseCacheReply {
            node_id: format!("fake-{}", self.role),
            role: self.role.into(),
            entries: 3,
            pages_zeroed: 2,
            pages_deferred: 1,
            digest: vec![self.role.len() as u8; 32],
        }))
    }
}

type TokenStream = Pin<Box<dyn Stream<Item = Result<TokenEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Decode for Inner {
    async fn reserve(
        &self,
        req: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        let r = req.into_inner();
        self.calls.lock().reserve.push(r.clone());
        if let Some(code) = self.opts.lock().fail {
            return Err(Status::new(code, "fake decode refuses"));
        }
        let pages = r.prompt_tokens.div_ceil(16);
        Ok(Response::new(ReserveReply {
            req: r.req,
            grant: Some(WriteGrant {
                key: vec![7; 16],
                tenant: r.tenant,
                pages: (0..pages)
                    .map(|p| GrantPage {
                        page: p,
                        generation: 1,
                    })
                    .collect(),
                tokens: r.prompt_tokens,
                page_size: 16,
                expires_unix_ms: 0,
                transfer_addr: "127.0.0.1:1".into(),
                ..Default::default()
            }),
        }))
    }

    type GenerateStream = TokenStream;

    async fn generate(
        &self,
        req: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let g = req.into_inner();
        self.calls.lock().generate.push(g.clone());
        let o = self.opts.lock().clone();
        let reference = g.req.clone();
        // max_tokens was said once, at Reserve.
        let sampling = self
            .calls
            .lock()
            .reserve
            .iter()
            .rev()
            .find(|r| r.req == g.req)
            .and_then(|r| r.sampling.clone());
        let max = sampling.as_ref().map_or(1, |s| s.max_tokens) as usize;
        let logprobs = sampling.is_some_and(|s| s.logprobs.is_some());
        let first = g.first_token;
        let stream = async_stream(reference, first, max, logprobs, o);
        Ok(Response::new(stream))
    }

    async fn abort(&self, req: Request<AbortRequest>) -> Result<Response<AbortReply>, Status> {
        Inner::abort(self, req)
    }

    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<WorkerInfo>, Status> {
        Inner::info(self)
    }

    async fn erase_cache(
        &self,
        req: Request<EraseCacheRequest>,
    ) -> Result<Response<EraseCacheReply>, Status> {
        Inner::erase(self, req)
    }
}

/// The fake's text for token `i` of a generation: deterministic, so streaming and full agree.
pub fn fake_text(i: usize) -> String {
    format!("w{i} ")
}

/// The fake's logprob of token `i` of a generation, when asked for: distinct per position.
pub fn fake_logprob(i: usize) -> f32 {
    -0.125 * (i as f32 + 1.0)
}

fn async_stream(
    reference: Option<RequestRef>,
    first: u32,
    max: usize,
    logprobs: bool,
    o: FakeOpts,
) -> TokenStream {
    let stale = o.stale_event.then(|| TokenEvent {
        req: Some(RequestRef {
            request_id: vec![0xEE; 16],
            attempt: 1,
        }),
        token: 99,
        text: "STALE".into(),
        finish: 0,
        marker_only: false,
        logprobs: None,
        account: None,
    });
    let scripted = o.script.as_ref().map(Vec::len);
    let emit = o
        .hang_after
        .or(o.eog_after)
        .or(scripted)
        .unwrap_or(max)
        .min(max);
    let hang = o.hang_after.is_some_and(|h| h < max);
    let eog = o.eog_after.or(scripted).is_some_and(|e| e < max);
    let script = o.script.clone();
    let marker = reference.clone();
    let events = (0..emit).map(move |i| {
        let token = if i == 0 { first } else { 10 + i as u32 };
        TokenEvent {
            req: reference.clone(),
            token,
            text: script
                .as_ref()
                .map_or_else(|| fake_text(i), |s| s[i].clone()),
            finish: if i + 1 == max {
                FinishReason::Length as i32
            } else {
                0
            },
            marker_only: false,
            logprobs: logprobs.then(|| Logprobs {
                chosen: Some(TokenLogprob {
                    token,
                    logprob: fake_logprob(i),
                }),
                top: Vec::new(),
            }),
            account: None,
        }
    });
    // End of generation: a marker-only STOP event that carries no completion token.
    let end = eog.then(|| TokenEvent {
        req: marker,
        token: 2,
        text: String::new(),
        finish: FinishReason::Stop as i32,
        marker_only: true,
        logprobs: None,
        account: None,
    });
    let events = events.chain(end);
    let body = futures::stream::iter(stale.into_iter().chain(events)).map(Ok);
    if hang {
        Box::pin(body.chain(futures::stream::pending()))
    } else {
        Box::pin(body)
    }
}

#[tonic::async_trait]
impl Prefill for Inner {
    async fn prefill(
        &self,
        req: Request<PrefillRequest>,
    ) -> Result<Response<PrefillReply>, Status> {
        let r = req.into_inner();
        self.calls.lock().prefill.push(r.clone());
        let o = self.opts.lock().clone();
        if o.hang_prefill {
            futures::future::pending::<()>().await;
        }
        if let Some(code) = o.fail {
            return Err(Status::new(code, "fake prefill fails"));
        }
        let tokens = r.prompt_tokens.len() as u32;
        Ok(Response::new(PrefillReply {
            req: r.req,
            manifest: Some(CommitManifest {
                grant_key: r.grant.map(|g| g.key).unwrap_or_default(),
                tokens_written: tokens,
                page_checksums: vec![],
                digest: 0,
            }),
            first_token: 5,
            transfer_bytes: 0,
            transfer_micros: 0,
            first_logprobs: None,
            cached_tokens: 0,
            prompt_logprobs: vec![],
            reused: vec![],
        }))
    }

    async fn abort(&self, req: Request<AbortRequest>) -> Result<Response<AbortReply>, Status> {
        Inner::abort(self, req)
    }

    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<WorkerInfo>, Status> {
        Inner::info(self)
    }

    async fn erase_cache(
        &self,
        req: Request<EraseCacheRequest>,
    ) -> Result<Response<EraseCacheReply>, Status> {
        Inner::erase(self, req)
    }
}

use futures::StreamExt;

async fn start(role: &'static str, opts: FakeOpts) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let inner = Inner {
        role,
        calls: Arc::default(),
        opts: Arc::new(Mutex::new(opts)),
    };
    let fake = Fake {
        addr,
        calls: inner.calls.clone(),
        opts: inner.opts.clone(),
    };
    let router = tonic::transport::Server::builder();
    let incoming = TcpListenerStream::new(listener);
    match role {
        "decode" => {
            let svc = DecodeServer::new(inner);
            tokio::spawn(async move {
                let mut router = router;
                router
                    .add_service(svc)
                    .serve_with_incoming(incoming)
                    .await
                    .unwrap()
            });
        }
        _ => {
            let svc = PrefillServer::new(inner);
            tokio::spawn(async move {
                let mut router = router;
                router
                    .add_service(svc)
                    .serve_with_incoming(incoming)
                    .await
                    .unwrap()
            });
        }
    }
    fake
}

pub async fn start_decode(opts: FakeOpts) -> Fake {
    start("decode", opts).await
}

pub async fn start_prefill(opts: FakeOpts) -> Fake {
    start("prefill", opts).await
}
