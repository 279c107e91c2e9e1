//! The workers behind the router: their gRPC channels, liveness learned by polling `Info`, the
//! effective context (I3), and least-loaded picking with an RAII in-flight lease.
//!
//! The workers are the fixed URLs and what the `dns://` sources resolve to at each poll
//! ([`crate::discovery`]).
//!
//! Liveness of one worker: `Unknown ──poll ok──▶ Live ──poll fails / RPC unavailable──▶ Down`,
//! and `Down ──poll ok──▶ Live`. Only `Live` workers count for the context and for picking.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_common::namespace::Namespace;
use pagewarden_common::tls::{self, SuiteRole};
use pagewarden_proto::v1::decode_client::DecodeClient;
use pagewarden_proto::v1::prefill_client::PrefillClient;
use pagewarden_proto::v1::{InfoRequest, WorkerInfo};
use pagewarden_types::worker_status::{WorkerState, WorkerStatus};
use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};
use tonic::transport::Channel;

use crate::discovery::{lookup, Resolve, Source, SystemResolver};
use crate::error::{Half, RouterError};
use crate::telemetry::traced;

/// How the router's channels to its workers behave.
#[derive(Clone, Copy, Debug)]
pub struct Links {
    /// Bound on opening a connection.
    pub connect_timeout: Duration,
    /// HTTP/2 keep-alive: a ping this often, even while idle, and a connection that leaves one
    /// unanswered this long is closed. A worker that died or froze (SIGSTOP, a hung host) then
    /// fails the calls on it within twice this, whatever phase they are in; a worker that is
    /// busy computing still answers, its runtime being free.
    pub keepalive: Duration,
}

/// What a live worker last advertised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoSnapshot {
    /// Node id.
    pub node_id: String,
    /// Advertised context length (after its preflight).
    pub context_length: u32,
    /// KV pool capacity in tokens.
    pub pool_tokens: u64,
    /// Free pages at the last poll.
    pub free_pages: u64,
    /// Requests active at the last poll.
    pub active_requests: u32,
    /// Requests waiting in its queue at the last poll.
    pub queue_depth: u32,
    /// Its forward pass's arithmetic (`cpu:avx512`, `cuda`, ...).
    pub arithmetic: String,
    /// Pages in its KV pool.
    pub total_pages: u64,
    /// Its build's version.
    pub version: String,
}

impl InfoSnapshot {
    /// The longest sequence this worker can hold: min(context, pool).
    pub fn usable_context(&self) -> u32 {
        u64::from(self.context_length).min(self.pool_tokens) as u32
    }
}

impl From<WorkerInfo> for InfoSnapshot {
    fn from(i: WorkerInfo) -> Self {
        Self {
            node_id: i.node_id,
            context_length: i.context_length,
            pool_tokens: i.pool_tokens,
            free_pages: i.free_pages,
            active_requests: i.active_requests,
            queue_depth: i.queue_depth,
            arithmetic: i.arithmetic,
            total_pages: i.total_pages,
            version: i.version,
        }
    }
}

/// A worker's liveness.
#[derive(Clone, Debug)]
pub enum Liveness {
    /// Not polled yet.
    Unknown,
    /// The last poll succeeded.
    Live {
        /// What it advertised.
        info: InfoSnapshot,
        /// When.
        at: Instant,
    },
    /// The last poll or RPC failed.
    Down {
        /// Why.
        error: String,
    },
}

/// How often a request checks whether its worker has gone silent.
const SILENCE_CHECK: Duration = Duration::from_millis(250);

/// One configured worker.
pub struct Worker {
    half: Half,
    /// Index of the `--decode` / `--prefill` entry it came from.
    source: usize,
    url: String,
    channel: Channel,
    liveness: Mutex<Liveness>,
    /// The node id of its last successful poll, kept while it is down.
    known_as: Mutex<Option<String>>,
    /// Since when every Info poll has gone unanswered (a refusal, such as a draining
    /// worker's, is an answer).
    silent_since: Mutex<Option<Instant>>,
    in_flight: AtomicUsize,
}

impl Worker {
    /// A worker at `url` (lazy channel: nothing connects until the first poll).
    fn new(half: Half, source: usize, url: &str, links: Links) -> Result<Arc<Self>, PoolError> {
        let url = normalize(url);
        let role = match half {
            Half::Decode => SuiteRole::Decode,
            Half::Prefill => SuiteRole::Prefill,
        };
        let endpoint = tls::endpoint(&url, role, &tls::client_tls())
            .map_err(|e| PoolError {
                url: url.clone(),
                message: e.to_string(),
            })?
            .connect_timeout(links.connect_timeout)
            .http2_keep_alive_interval(links.keepalive)
            .keep_alive_timeout(links.keepalive)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        Ok(Arc::new(Self {
            half,
            source,
            url,
            channel: endpoint.connect_lazy(),
            liveness: Mutex::new(Liveness::Unknown),
            known_as: Mutex::new(None),
            silent_since: Mutex::new(None),
            in_flight: AtomicUsize::new(0),
        }))
    }

    /// Which half this worker is.
    pub fn half(&self) -> Half {
        self.half
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A decode client on this worker's channel.
    pub fn decode(&self) -> DecodeClient<Channel> {
        DecodeClient::new(self.channel.clone())
    }

    /// A prefill client on this worker's channel.
    pub fn prefill(&self) -> PrefillClient<Channel> {
        PrefillClient::new(self.channel.clone())
    }

    /// Its current liveness.
    pub fn liveness(&self) -> Liveness {
        self.liveness.lock().clone()
    }

    /// The snapshot when live.
    pub fn live_info(&self) -> Option<InfoSnapshot> {
        match &*self.liveness.lock() {
            Liveness::Live { info, .. } => Some(info.clone()),
            Liveness::Unknown | Liveness::Down { .. } => None,
        }
    }

    /// What `/health` says of it.
    pub fn status(&self) -> WorkerStatus {
        let mut s = WorkerStatus {
            role: self.half.as_str().into(),
            node_id: self.known_as.lock().clone(),
            state: WorkerState::Unknown,
            error: None,
            context_length: None,
            total_pages: None,
            free_pages: None,
            active_requests: None,
            queue_depth: None,
            arithmetic: None,
            version: None,
        };
        match self.liveness() {
            Liveness::Unknown => {}
            Liveness::Down { error } => {
                s.state = WorkerState::Down;
                s.error = Some(error);
            }
            Liveness::Live { info, .. } => {
                s.state = WorkerState::Live;
                s.context_length = Some(info.context_length);
                s.total_pages = Some(info.total_pages);
                s.free_pages = Some(info.free_pages);
                s.active_requests = Some(info.active_requests);
                s.queue_depth = Some(info.queue_depth);
                s.arithmetic = Some(info.arithmetic);
                s.version = Some(info.version);
            }
        }
        s
    }

    /// Marks the worker down until its next successful poll.
    pub fn mark_down(&self, error: impl Into<String>) {
        *self.liveness.lock() = Liveness::Down {
            error: error.into(),
        };
    }

    /// Resolves once this worker's Info polls have gone unanswered for `after` in a row: a
    /// worker that froze or vanished mid-request, which the request's other half (a prefill
    /// writing KV into it) would otherwise wait on for good.
    pub async fn silent_for(&self, after: Duration) {
        loop {
            if self
                .silent_since
                .lock()
                .is_some_and(|t| t.elapsed() >= after)
            {
                return;
            }
            tokio::time::sleep(SILENCE_CHECK).await;
        }
    }

    async fn poll(&self, timeout: Duration) {
        let fut = async {
            match self.half {
                Half::Decode => self.decode().info(traced(InfoRequest {})).await,
                Half::Prefill => self.prefill().info(traced(InfoRequest {})).await,
            }
        };
        let answer = tokio::time::timeout(timeout, fut).await;
        // A status the worker sent (a draining worker's refusal) is an answer; a status made
        // here from a failed call (its cause attached: a reset connection, a keep-alive that
        // timed out) is not, and neither is no reply at all.
        let answered = match &answer {
            Ok(Ok(_)) => true,
            Ok(Err(status)) => std::error::Error::source(status).is_none(),
            Err(_) => false,
        };
        {
            let mut silent = self.silent_since.lock();
            *silent = match answered {
                true => None,
                false => Some(silent.unwrap_or_else(Instant::now)),
            };
        }
        let next = match answer {
            Ok(Ok(reply)) => Liveness::Live {
                info: reply.into_inner().into(),
                at: Instant::now(),
            },
            Ok(Err(status)) => Liveness::Down {
                error: format!("Info failed: {status}"),
            },
            Err(_) => Liveness::Down {
                error: format!("Info timed out after {timeout:?}"),
            },
        };
        if let Liveness::Live { info, .. } = &next {
            *self.known_as.lock() = Some(info.node_id.clone());
        }
        if let Liveness::Down { error } = &next {
            tracing::debug!(url = %self.url, half = self.half.as_str(), %error, "worker not live");
        }
        *self.liveness.lock() = next;
    }
}

/// A worker picked for one request; its in-flight count drops when the lease does.
pub struct Lease {
    worker: Arc<Worker>,
}

impl Lease {
    fn new(worker: Arc<Worker>) -> Self {
        worker.in_flight.fetch_add(1, Ordering::Relaxed);
        Self { worker }
    }

    /// The leased worker.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.worker.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why the pool could not be built.
#[derive(Debug, thiserror::Error)]
#[error("bad worker URL `{url}`: {message}")]
pub struct PoolError {
    url: String,
    message: String,
}

/// One half's workers and where they come from.
struct HalfPool {
    half: Half,
    sources: Vec<Source>,
    /// The workers now: one per fixed URL, one per address a DNS source resolved to.
    workers: RwLock<Vec<Arc<Worker>>>,
}

/// Every worker, by half: the configured URLs, and what the DNS sources resolve to.
pub struct WorkerPool {
    decode: HalfPool,
    prefill: HalfPool,
    links: Links,
    info_timeout: Duration,
    resolver: Arc<dyn Resolve>,
}

impl WorkerPool {
    /// Creates lazy channels for the fixed URLs (nothing connects until the first poll); the
    /// DNS sources are resolved at each [`WorkerPool::refresh`].
    pub fn new(
        decode: &[String],
        prefill: &[String],
        links: Links,
        info_timeout: Duration,
    ) -> Result<Self, PoolError> {
        let half = |half: Half, entries: &[String]| -> Result<HalfPool, PoolError> {
            let sources = entries
                .iter()
                .map(|e| {
                    Source::parse(e).map_err(|err| PoolError {
                        url: e.clone(),
                        message: err.to_string(),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let workers = sources
                .iter()
                .enumerate()
                .filter_map(|(i, s)| match s {
                    Source::Url(url) => Some(Worker::new(half, i, url, links)),
                    Source::Dns { .. } => None,
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(HalfPool {
                half,
                sources,
                workers: RwLock::new(workers),
            })
        };
        Ok(Self {
            decode: half(Half::Decode, decode)?,
            prefill: half(Half::Prefill, prefill)?,
            links,
            info_timeout,
            resolver: Arc::new(SystemResolver),
        })
    }

    /// The same pool, resolving DNS sources with `resolver`.
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    fn half(&self, half: Half) -> &HalfPool {
        match half {
            Half::Decode => &self.decode,
            Half::Prefill => &self.prefill,
        }
    }

    /// Workers of one half, as they are now.
    pub fn workers(&self, half: Half) -> Vec<Arc<Worker>> {
        self.half(half).workers.read().clone()
    }

    /// Re-resolves every DNS source: a new address becomes a worker (`Unknown` until polled),
    /// an address no longer there leaves the pool (requests holding its lease finish on it).
    pub async fn discover(&self) {
        for pool in [&self.decode, &self.prefill] {
            for (i, source) in pool.sources.iter().enumerate() {
                let Source::Dns { name, port } = source else {
                    continue;
                };
                let Some(urls) = lookup(self.resolver.as_ref(), name, *port).await else {
                    continue;
                };
                let mut workers = pool.workers.write();
                workers.retain(|w| {
                    let keep = w.source != i || urls.contains(&w.url);
                    if !keep {
                        tracing::info!(half = pool.half.as_str(), url = %w.url, %name, "worker left the name");
                    }
                    keep
                });
                for url in &urls {
                    if workers.iter().any(|w| w.source == i && &w.url == url) {
                        continue;
                    }
                    match Worker::new(pool.half, i, url, self.links) {
                        Ok(w) => {
                            tracing::info!(half = pool.half.as_str(), %url, %name, "worker found by name");
                            workers.push(w);
                        }
                        Err(e) => tracing::warn!(%url, %name, error = %e, "found worker unusable"),
                    }
                }
            }
        }
    }

    /// Re-resolves the DNS sources, then polls every worker's `Info` concurrently.
    pub async fn refresh(&self) {
        self.discover().await;
        let all: Vec<Arc<Worker>> = self
            .workers(Half::Decode)
            .into_iter()
            .chain(self.workers(Half::Prefill))
            .collect();
        futures::future::join_all(all.iter().map(|w| w.poll(self.info_timeout))).await;
    }

    /// Every worker, decode first, as `/health` reports them.
    pub fn statuses(&self) -> Vec<WorkerStatus> {
        [Half::Decode, Half::Prefill]
            .into_iter()
            .flat_map(|half| self.workers(half))
            .map(|w| w.status())
            .collect()
    }

    /// Number of live workers of one half.
    pub fn live_count(&self, half: Half) -> usize {
        self.workers(half)
            .iter()
            .filter(|w| w.live_info().is_some())
            .count()
    }

    /// min over live workers of min(context_length, pool_tokens); 503 unless at least one decode
    /// and one prefill worker are live.
    pub fn effective_context(&self) -> Result<u32, RouterError> {
        let min_of = |half: Half| {
            self.workers(half)
                .iter()
                .filter_map(|w| w.live_info())
                .map(|i| i.usable_context())
                .min()
        };
        let decode = min_of(Half::Decode).ok_or(RouterError::NoLiveWorkers("decode"))?;
        let prefill = min_of(Half::Prefill).ok_or(RouterError::NoLiveWorkers("prefill"))?;
        Ok(decode.min(prefill))
    }

    /// The least-loaded live worker of one half: shortest queue at its last poll (a request
    /// sent there waits), then fewest requests in flight from this router (fresher than any
    /// poll, so a burst spreads), then most free pages, then fewest active.
    pub fn pick(&self, half: Half) -> Result<Lease, RouterError> {
        self.workers(half)
            .iter()
            .filter_map(|w| w.live_info().map(|i| (w, i)))
            .min_by_key(|(w, i)| {
                (
                    i.queue_depth,
                    w.in_flight.load(Ordering::Relaxed),
                    std::cmp::Reverse(i.free_pages),
                    i.active_requests,
                )
            })
            .map(|(w, _)| Lease::new(w.clone()))
            .ok_or(RouterError::NoLiveWorkers(half.as_str()))
    }

    /// The worker of one half for a request of `namespace`: the namespace's own worker, chosen
    /// by rendezvous hashing over the live ones (so a tenant's cached prefixes, on prefill and
    /// on decode, are where its next request goes, and a worker leaving moves only its own
    /// namespaces), unless that worker is busier than the least-loaded one by more than
    /// [`AFFINITY_SLACK`] requests, or has a queue while another has none: then the
    /// least-loaded, as [`WorkerPool::pick`].
    pub fn pick_for(&self, half: Half, namespace: &Namespace) -> Result<Lease, RouterError> {
        let workers = self.workers(half);
        let live: Vec<(&Arc<Worker>, usize, bool)> = workers
            .iter()
            .filter_map(|w| {
                let queued = w.live_info()?.queue_depth as usize;
                let load = queued + w.in_flight.load(Ordering::Relaxed);
                Some((w, load, queued > 0))
            })
            .collect();
        let least = live.iter().map(|&(_, load, _)| load).min();
        // A request sent to a worker with a queue waits there: never while another has none.
        let some_unqueued = live.iter().any(|&(_, _, queued)| !queued);
        let home = live.iter().max_by_key(|(w, _, _)| {
            let mut h = Sha256::new();
            h.update(namespace.as_bytes());
            h.update(w.url().as_bytes());
            <[u8; 32]>::from(h.finalize())
        });
        match (home, least) {
            (Some(&(w, load, queued)), Some(least))
                if load <= least + AFFINITY_SLACK && !(queued && some_unqueued) =>
            {
                Ok(Lease::new(w.clone()))
            }
            _ => self.pick(half),
        }
    }
}

/// How many more requests (queued there, or in flight from this router) a namespace's own
/// worker may have than the least-loaded one before a request goes elsewhere: a cache
/// hit saves a whole prefix, a wait behind a few prompts costs less.
pub const AFFINITY_SLACK: usize = 2;

/// Accepts `host:port` as well as `http://host:port`.
fn normalize(url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}
