//! Trace context into gRPC metadata, so router → prefill → decode is one trace (W3C
//! `traceparent`, through `pagewarden_common::telemetry`).

/// Wraps a message in a `tonic::Request` carrying the current span's trace context.
pub fn traced<T>(message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    pagewarden_common::telemetry::inject_trace_context(req.metadata_mut());
    req
}
