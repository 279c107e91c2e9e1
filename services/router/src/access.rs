//! The root span and the access log of every HTTP request.
//!
//! Each request runs inside one `http_request` span, joined to the client's W3C `traceparent`
//! when it sends one, so admission, dispatch and the workers' spans form one trace with the
//! client's; the response carries the span's own `traceparent`, so a client can find its
//! trace. One `access` line is logged when the response head leaves (method, path, status,
//! milliseconds to the head, trace id): a stream's body goes on after it.

use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use pagewarden_common::telemetry::{
    accept_http_trace_context, inject_http_trace_context, trace_id,
};
use tracing::Instrument;

/// Middleware: the request's root span, its `traceparent` answer and its access line.
pub async fn access(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let span = tracing::info_span!(
        "http_request",
        method = %method,
        path = %path,
        status = tracing::field::Empty,
    );
    accept_http_trace_context(&span, req.headers());
    let mut response = next.run(req).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.record("status", status);
    inject_http_trace_context(&span, response.headers_mut());
    let trace_id = trace_id(&span).unwrap_or_default();
    tracing::info!(
        target: "access",
        parent: &span,
        %method,
        path = %path,
        status,
        ms = started.elapsed().as_millis() as u64,
        %trace_id,
        "access"
    );
    response
}
