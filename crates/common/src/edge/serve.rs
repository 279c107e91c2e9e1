//! The accept loop and each connection's task: every connection is in the [`Table`], a reaper
//! closes those past their deadline, and caps close the oldest idle connection for a new one.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::body::{DeadlineBody, MarkedBody};
use super::limits::EdgeLimits;
use super::table::{Closed, ConnId, Table};
use crate::metrics::ReasonLabel;

/// How long a connection closed by a cap or a deadline gets to send its HTTP/2 GOAWAY.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// The edge's counts, registered by the service that owns the listener.
#[derive(Clone, Debug, Default)]
pub struct EdgeCounters {
    /// Connections refused on accept, by reason.
    pub refused: Family<ReasonLabel, Counter>,
    /// Connections the edge closed (deadlines, caps), by reason.
    pub closed: Family<ReasonLabel, Counter>,
}

impl EdgeCounters {
    /// Registers both counts in `registry` (`refused_connections`, `closed_connections`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "refused_connections",
            "Client connections refused on accept because every place was busy, by cap",
            self.refused.clone(),
        );
        registry.register(
            "closed_connections",
            "Idle or unauthenticated client connections closed by a deadline or a cap",
            self.closed.clone(),
        );
    }

    /// Both counts as Prometheus text under `prefix`, for a service that renders its own text.
    pub fn render_text(&self, prefix: &str) -> String {
        let mut registry = Registry::with_prefix(prefix);
        self.register(&mut registry);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out.strip_suffix("# EOF\n").unwrap_or(&out).to_string()
    }
}

struct Shared {
    table: Mutex<Table>,
    counters: EdgeCounters,
}

impl Shared {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the table and counts the connections it closed.
    fn with<R>(&self, f: impl FnOnce(&mut Table, &mut Closed) -> R) -> R {
        let mut closed = Closed::new();
        let r = f(&mut self.table(), &mut closed);
        for why in closed {
            self.counters
                .closed
                .get_or_create(&ReasonLabel {
                    reason: why.as_str(),
                })
                .inc();
        }
        r
    }
}

/// A request extension naming the request's connection: a handler that authenticated the
/// request tells the edge, so that the connection counts against its principal instead of its
/// source address.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    id: ConnId,
    peer: SocketAddr,
}

impl Connection {
    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// A request on this connection carried valid credentials of `principal` (a tenant, an
    /// operator). The first principal of a connection stays its principal.
    pub fn authenticated(&self, principal: &str) {
        self.shared
            .with(|t, closed| t.authenticated(self.id, principal, closed));
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("id", &self.id).finish()
    }
}

/// A request in flight on a connection; its drop ends it.
struct InFlight(Connection);

impl InFlight {
    fn begin(conn: Connection) -> Self {
        conn.shared.table().begin(conn.id, Instant::now());
        InFlight(conn)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let c = &self.0;
        c.shared
            .with(|t, closed| t.end(c.id, Instant::now(), closed));
    }
}

/// The hyper service of one connection: marks requests in flight, bounds their bodies, and
/// hands them to the app with their [`Connection`].
#[derive(Clone)]
struct EdgeService {
    app: axum::Router,
    conn: Connection,
    body_timeout: Duration,
}

impl hyper::service::Service<Request<Incoming>> for EdgeService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let mark = InFlight::begin(self.conn.clone());
        let within = self.body_timeout;
        let mut req = req.map(|b| Body::new(DeadlineBody::new(Body::new(b), within)));
        req.extensions_mut().insert(self.conn.clone());
        let mut app = self.app.clone();
        Box::pin(async move {
            let resp = tower::Service::call(&mut app, req).await?;
            Ok(resp.map(|b| Body::new(MarkedBody::new(b, mark))))
        })
    }
}

/// Serves `app` on `listener` under `limits` until `shutdown` resolves, then stops accepting
/// and waits for open connections to finish their requests.
pub async fn serve_edge(
    listener: TcpListener,
    app: axum::Router,
    limits: EdgeLimits,
    counters: EdgeCounters,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(limits.h2_ping_interval))
        .keep_alive_timeout(limits.h2_ping_timeout);
    let shared = Arc::new(Shared {
        table: Mutex::new(Table::new(limits)),
        counters,
    });
    let reaper = tokio::spawn(reap(shared.clone(), limits.reap_every()));
    let stop = CancellationToken::new();
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while conns.try_join_next().is_some() {}
        let admitted = shared.with(|t, closed| t.admit(peer.ip(), Instant::now(), closed));
        let (id, close) = match admitted {
            Ok(a) => a,
            Err(refusal) => {
                shared
                    .counters
                    .refused
                    .get_or_create(&ReasonLabel {
                        reason: refusal.as_str(),
                    })
                    .inc();
                tracing::debug!(%peer, reason = refusal.as_str(), "connection refused");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let svc = EdgeService {
            app: app.clone(),
            conn: Connection {
                shared: shared.clone(),
                id,
                peer,
            },
            body_timeout: limits.body_timeout,
        };
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
            .into_owned();
        let shared = shared.clone();
        let stop = stop.clone();
        conns.spawn(async move {
            tokio::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => r,
                () = close.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    tokio::time::timeout(CLOSE_GRACE, conn.as_mut())
                        .await
                        .unwrap_or(Ok(()))
                }
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.as_mut().await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            shared.table().remove(id);
        });
    }
    drop(listener);
    stop.cancel();
    while conns.join_next().await.is_some() {}
    reaper.abort();
    Ok(())
}

async fn reap(shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        shared.with(|t, closed| t.reap(Instant::now(), closed));
    }
}
