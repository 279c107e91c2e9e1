//! Logging and tracing: `tracing-subscriber` with an env filter (`RUST_LOG`, default `info`),
//! plain or JSON lines, and OpenTelemetry OTLP export (gRPC) when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is set. Trace context crosses services in gRPC metadata (W3C `traceparent`): clients add
//! [`TraceInterceptor`], servers call [`accept_trace_context`] on each request's metadata; an
//! HTTP edge joins a client's `traceparent` header with [`accept_http_trace_context`].

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;

/// Telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter could not be built.
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
    /// A global subscriber was already installed.
    #[error("cannot install the tracing subscriber: {0}")]
    Subscriber(String),
}

/// Flushes and shuts the OTLP exporter down when dropped.
#[must_use = "dropping the guard stops trace export"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            // Best effort: a collector that went away must not block shutdown.
            let _ = p.shutdown();
        }
    }
}

/// Installs the global subscriber for `service`. Call once, inside a tokio runtime (the OTLP
/// gRPC channel needs one).
pub fn init_telemetry(service: &'static str, json: bool) -> Result<TelemetryGuard, TelemetryError> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .build();
    let mut builder = SdkTracerProvider::builder().with_resource(resource);
    if let Ok(endpoint) = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        if !endpoint.is_empty() {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .build()
                .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
            builder = builder.with_batch_exporter(exporter);
        }
    }
    // Spans get trace ids even with nothing to export to, so that a client's `traceparent`
    // is continued (and answered) and log lines can name their trace.
    let provider = builder.build();
    // Trace context follows the spans at `info` whatever `RUST_LOG` says, so a quiet log level
    // never breaks a client's trace; `RUST_LOG` filters only what is logged.
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(service))
        .with_filter(LevelFilter::INFO);
    // Logs go to stderr: stdout carries the one parseable "listening" line.
    let fmt = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    } else {
        // Colour only on a terminal: a log file (`pagewarden up`'s `.pw/logs`) gets plain text.
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter)
            .boxed()
    };
    let result = tracing_subscriber::registry()
        .with(otel)
        .with(fmt)
        .try_init();
    result.map_err(|e| TelemetryError::Subscriber(e.to_string()))?;
    Ok(TelemetryGuard {
        provider: Some(provider),
    })
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value),
        ) {
            self.0.insert(k, v);
        }
    }
}

struct MetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

struct HeaderExtractor<'a>(&'a axum::http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Makes `span` a child of the trace context in incoming HTTP headers (`traceparent`,
/// `tracestate`), so a client's trace continues through the suite. Without one, `span` roots
/// a new trace.
pub fn accept_http_trace_context(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    let cx =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    // Fails only when the span is disabled; then there is nothing to link.
    let _ = span.set_parent(cx);
}

struct HeaderInjector<'a>(&'a mut axum::http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            axum::http::HeaderName::from_bytes(key.as_bytes()),
            axum::http::HeaderValue::try_from(value),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// Writes `span`'s trace context into HTTP headers (`traceparent`), e.g. of a response, so
/// a client can find its request's trace.
pub fn inject_http_trace_context(span: &tracing::Span, headers: &mut axum::http::HeaderMap) {
    let cx = span.context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut HeaderInjector(headers))
    });
}

/// `span`'s trace id in hex, when it has a valid one.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// Writes the current span's trace context into outgoing gRPC metadata.
pub fn inject_trace_context(metadata: &mut MetadataMap) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut MetadataInjector(metadata))
    });
}

/// Makes `span` a child of the trace context carried by incoming gRPC metadata (if any).
pub fn accept_trace_context(span: &tracing::Span, metadata: &MetadataMap) {
    let cx =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&MetadataExtractor(metadata)));
    // Fails only when the span is disabled; then there is nothing to link.
    let _ = span.set_parent(cx);
}

/// Client interceptor that propagates the current trace context on every call:
/// `DecodeClient::with_interceptor(channel, TraceInterceptor)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceInterceptor;

impl tonic::service::Interceptor for TraceInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        inject_trace_context(request.metadata_mut());
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extractor_reads_injected_pairs() {
        let mut map = MetadataMap::new();
        MetadataInjector(&mut map).set(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
        );
        let ex = MetadataExtractor(&map);
        assert_eq!(ex.keys(), vec!["traceparent"]);
        assert!(ex.get("traceparent").unwrap().starts_with("00-0af7"));
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&ex));
        use opentelemetry::trace::TraceContextExt;
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
    }
}
