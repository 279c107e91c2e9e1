//! The HTTP edge's own defenses, below the routes: a request head must arrive within
//! `header_timeout` (slowloris sockets are closed), a request body within `body_timeout` of its
//! head (a dribbled body ends in a 400), at most `max_connections` sockets are served at once,
//! and one client address holds at most `max_unauthenticated_per_addr` sockets that have not yet
//! shown a valid API key (more are closed on accept, so a flood from one host cannot exhaust
//! the process or crowd out other clients).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use http_body::{Frame, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::metrics::ReasonLabels;
use crate::unauthenticated::Unauthenticated;

/// Limits of the edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeLimits {
    /// Longest wait for a complete request head.
    pub header_timeout: Duration,
    /// Longest wait for a complete request body, from the end of its head.
    pub body_timeout: Duration,
    /// Most sockets served at once.
    pub max_connections: usize,
    /// Most sockets one client address may hold before a request on them carries a valid key.
    pub max_unauthenticated_per_addr: usize,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        EdgeLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_unauthenticated_per_addr: 64,
        }
    }
}

/// Serves `app` on `listener` under `limits` until `shutdown` resolves, then stops accepting
/// and waits for open connections to finish their requests. Connections closed on accept are
/// counted in `refused` by reason (`max_connections`, `unauthenticated_per_address`).
pub async fn serve_edge(
    listener: TcpListener,
    app: Router,
    limits: EdgeLimits,
    refused: Family<ReasonLabels, Counter>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let body_timeout = limits.body_timeout;
    let app = app.layer(axum::middleware::from_fn(
        move |req: Request, next: Next| body_deadline(req, next, body_timeout),
    ));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let unauthenticated = Unauthenticated::new(limits.max_unauthenticated_per_addr);
    let refuse = |reason: &'static str| refused.get_or_create(&ReasonLabels { reason }).inc();
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse("max_connections");
            tracing::debug!(%peer, "connection cap reached: closing");
            continue;
        };
        let Some(pending) = unauthenticated.admit(peer.ip()) else {
            refuse("unauthenticated_per_address");
            tracing::debug!(%peer, "unauthenticated connections per address reached: closing");
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Each request carries its connection's place in the count; the API key check takes
        // the connection out of it. The connection's own copy goes when the connection ends.
        let svc = TowerToHyperService::new(app.clone().map_request({
            let pending = pending.clone();
            move |mut req: Request<_>| {
                req.extensions_mut().insert(pending.clone());
                req
            }
        }));
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            drop(pending);
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

async fn body_deadline(req: Request, next: Next, within: Duration) -> Response {
    let req = req.map(|b| Body::new(DeadlineBody::new(b, within)));
    next.run(req).await
}

/// A request body that fails once `within` has passed before its end arrived.
struct DeadlineBody {
    inner: Body,
    within: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl DeadlineBody {
    fn new(inner: Body, within: Duration) -> Self {
        DeadlineBody {
            inner,
            within,
            deadline: Box::pin(tokio::time::sleep(within)),
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(f) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(f.map(|r| r.map_err(Into::into)));
        }
        match this.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                "the request body did not arrive within {:?}",
                this.within
            )
            .into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
