//! Configuration: flags over `PAGEWARDEN_ROUTER_*` variables over a toml file (`--config`),
//! through the suite's one configuration layer. Defaults run on one machine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::{Deserialize, Serialize};

use pagewarden_common::config::{is_false, layered, nonzero};
pub use pagewarden_common::config::{ConfigError, ModelSource};
use pagewarden_common::tls::{InternalTls, TlsFlags};

use crate::dispatch::DispatchConfig;
use crate::server::Settings;
use crate::tenants::TenantSource;
use pagewarden_common::edge::EdgeLimits;
use pagewarden_common::tenants::{Rate, TenantEntry};

/// Default listen address.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8080";
/// Default body limit: 2 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 2 << 20;
/// Default share of requests the recompute audit scores again (with `--auditor`).
pub const DEFAULT_RECOMPUTE_RATE: Rate = Rate::PERCENT_5;
/// Default concurrency limit.
pub const DEFAULT_MAX_CONCURRENCY: usize = 256;
/// Default HTTP/2 keep-alive towards the workers: a frozen worker fails its requests within
/// 20 s, while a freeze of a few seconds (a paused container, a GC-like stall) is ridden out.
pub const DEFAULT_WORKER_KEEPALIVE: Duration = Duration::from_secs(10);

/// The router's settings: command-line flags, and the keys of the `--config` file and of the
/// `PAGEWARDEN_ROUTER_*` variables (snake_case). A flag wins over the variable, the variable over
/// the file.
#[derive(Clone, Debug, Default, Parser, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[command(
    name = "pagewarden-router",
    about = "Pagewarden's OpenAI-compatible router"
)]
pub struct Args {
    /// toml config file (same keys as the flags, with `_` for `-`; may hold `[[tenants]]`).
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// HTTP listen address (`127.0.0.1:0` picks a free port).
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,
    /// GGUF model file (tokenizer and chat template).
    #[arg(long, env = "PAGEWARDEN_MODEL")]
    pub model: Option<PathBuf>,
    /// Use the seeded tiny test model instead of a file (tests only).
    #[arg(long)]
    pub tiny_test_model: Option<u64>,
    /// Log JSON lines instead of text.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub log_json: bool,
    /// Name served in /v1/models (default: the model file's stem).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Tenants toml file: `[[tenants]] name = "..", key_sha256 = ["<hex>"]`; reloaded on SIGHUP.
    #[arg(long = "tenants", value_name = "FILE")]
    pub tenants_file: Option<PathBuf>,
    /// File only: tenants written inline, as `[[tenants]]` tables of the config file.
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub tenants: Vec<TenantEntry>,
    /// A decode worker's gRPC URL, or `dns://NAME:PORT` for every address NAME resolves to,
    /// re-resolved at each poll (repeatable).
    #[arg(long)]
    pub decode: Vec<String>,
    /// A prefill worker's gRPC URL, or `dns://NAME:PORT` as for `--decode` (repeatable).
    #[arg(long)]
    pub prefill: Vec<String>,
    /// Largest accepted request body in bytes.
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Concurrent generation requests before 429.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// One tenant's concurrent generation requests before 429, for tenants whose entry sets
    /// no `max_concurrent` (default: no per-tenant limit).
    #[arg(long)]
    pub tenant_max_concurrency: Option<usize>,
    /// Whole-request deadline (`30s`, `500ms`, `2m`, or seconds); none by default: waiting is
    /// bounded by the workers' queue deadlines, a dead or frozen worker by
    /// `--worker-keepalive`, and the rest by the client's own timeout.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub request_timeout: Option<Duration>,
    /// HTTP/2 keep-alive towards the workers: a ping this often, and a connection that leaves
    /// one unanswered this long is closed, failing the requests on it; a request whose decode
    /// has answered no Info poll for twice this long fails too, wherever it waits (default
    /// `10s`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub worker_keepalive: Option<Duration>,
    /// How often to poll every worker's Info.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub info_interval: Option<Duration>,
    /// Bound on each Abort RPC.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub abort_timeout: Option<Duration>,
    /// The auditor's gRPC URL; when set, every finished response is sent to it as a sample.
    #[arg(long, env = "PAGEWARDEN_AUDITOR")]
    pub auditor: Option<String>,
    /// Ed25519 private key (PKCS#8 PEM, e.g. `openssl genpkey -algorithm ed25519`) that signs
    /// isolation receipts (`X-Pagewarden-Receipt: 1`); without it a request for one is a 400.
    #[arg(long, value_name = "FILE")]
    pub receipt_key: Option<PathBuf>,
    /// The share of requests (0 to 1; default 0.05) sent with their tokens and served logprobs
    /// to the auditor's recompute audit, for tenants whose entry sets no `recompute_rate`.
    /// Only with `--auditor`.
    #[arg(long, value_name = "SHARE")]
    pub recompute_rate: Option<Rate>,
    /// Internal mutual TLS towards workers and the auditor (this router's identity).
    #[command(flatten)]
    #[serde(flatten)]
    pub tls: TlsFlags,
    /// Longest wait for a request's head; slower sockets are closed.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Option<Duration>,
    /// Longest wait for a request's body after its head (400 past it).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Option<Duration>,
    /// Longest wait from accept to a connection's first complete request (HTTP/1 and HTTP/2).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub first_request_timeout: Option<Duration>,
    /// Longest a kept-alive connection may sit without a request in flight.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// How often HTTP/2 connections are pinged.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub h2_ping_interval: Option<Duration>,
    /// How long an HTTP/2 ping may go unanswered before its connection is closed.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub h2_ping_timeout: Option<Duration>,
    /// Most client connections open at once; past it the oldest idle or unauthenticated one is
    /// closed for the new one.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Most connections with no request in flight; past it the oldest is closed.
    #[arg(long)]
    pub max_idle_connections: Option<usize>,
    /// Most connections one client address may hold before a request on them carries a valid
    /// API key; past it that address's oldest idle one is closed.
    #[arg(long)]
    pub max_unauthenticated_per_addr: Option<usize>,
    /// Most connections authenticated as one tenant, from any address; past it that tenant's
    /// oldest idle one is closed.
    #[arg(long)]
    pub max_connections_per_tenant: Option<usize>,
}

/// The resolved configuration.
#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// Listen address.
    pub http_addr: SocketAddr,
    /// Where the tokenizer and chat template come from.
    pub model: ModelSource,
    /// Log JSON lines.
    pub log_json: bool,
    /// Served name override.
    pub served_model_name: Option<String>,
    /// Tenants: the config file's and the tenants file (read at start and on SIGHUP).
    pub tenants: TenantSource,
    /// Decode URLs.
    pub decode: Vec<String>,
    /// Prefill URLs.
    pub prefill: Vec<String>,
    /// Body limit.
    pub max_body_bytes: usize,
    /// Concurrency limit.
    pub max_concurrency: usize,
    /// Default per-tenant concurrency limit.
    pub tenant_max_concurrency: Option<usize>,
    /// Whole-request deadline, when the operator set one.
    pub request_timeout: Option<Duration>,
    /// HTTP/2 keep-alive interval and timeout towards the workers.
    pub worker_keepalive: Duration,
    /// Info poll interval.
    pub info_interval: Duration,
    /// Info RPC timeout.
    pub info_timeout: Duration,
    /// Connect timeout to workers.
    pub connect_timeout: Duration,
    /// Abort RPC timeout.
    pub abort_timeout: Duration,
    /// The auditor's gRPC URL (samples are sent there when set).
    pub auditor: Option<String>,
    /// The isolation receipts' signing key file, when receipts are served.
    pub receipt_key: Option<PathBuf>,
    /// The recompute audit's default share of requests.
    pub recompute_rate: Rate,
    /// Internal mutual TLS (this router's client identity), or plaintext.
    pub tls: InternalTls,
    /// Deadlines and connection caps of the HTTP edge.
    pub edge: EdgeLimits,
}

/// Worker and auditor URLs may omit `http://`.
fn with_scheme(url: String) -> String {
    if url.contains("://") {
        url
    } else {
        format!("http://{url}")
    }
}

impl RouterConfig {
    /// Resolves flags over the environment over the `--config` file over defaults.
    pub fn resolve(args: Args) -> Result<Self, ConfigError> {
        let s: Args = layered(&args, args.config.as_deref(), "PAGEWARDEN_ROUTER_")?;
        let tls = InternalTls::load(&s.tls)?;
        let defaults = EdgeLimits::default();
        let edge = EdgeLimits {
            header_timeout: s.header_read_timeout.unwrap_or(defaults.header_timeout),
            body_timeout: s.body_read_timeout.unwrap_or(defaults.body_timeout),
            first_request_timeout: s
                .first_request_timeout
                .unwrap_or(defaults.first_request_timeout),
            idle_timeout: s.idle_timeout.unwrap_or(defaults.idle_timeout),
            h2_ping_interval: s.h2_ping_interval.unwrap_or(defaults.h2_ping_interval),
            h2_ping_timeout: s.h2_ping_timeout.unwrap_or(defaults.h2_ping_timeout),
            max_connections: nonzero(
                "max_connections",
                s.max_connections.unwrap_or(defaults.max_connections),
            )?,
            max_idle_connections: nonzero(
                "max_idle_connections",
                s.max_idle_connections
                    .unwrap_or(defaults.max_idle_connections),
            )?,
            max_unauthenticated_per_addr: nonzero(
                "max_unauthenticated_per_addr",
                s.max_unauthenticated_per_addr
                    .unwrap_or(defaults.max_unauthenticated_per_addr),
            )?,
            max_connections_per_principal: nonzero(
                "max_connections_per_tenant",
                s.max_connections_per_tenant
                    .unwrap_or(defaults.max_connections_per_principal),
            )?,
        };
        let tenants = TenantSource {
            inline: s.tenants,
            file: s.tenants_file,
        };
        if s.decode.is_empty() || s.prefill.is_empty() {
            return Err(ConfigError::Invalid(
                "at least one --decode and one --prefill worker URL are required".into(),
            ));
        }
        let model = ModelSource::pick(s.tiny_test_model, s.model)?;
        let max_concurrency = nonzero(
            "max_concurrency",
            s.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY),
        )?;
        if s.tenant_max_concurrency == Some(0) {
            return Err(ConfigError::Invalid(
                "--tenant-max-concurrency must be at least 1 (leave it out for no per-tenant \
                 limit)"
                    .into(),
            ));
        }
        let info_interval = s.info_interval.unwrap_or(Duration::from_secs(1));
        Ok(Self {
            http_addr: s
                .http_addr
                .unwrap_or_else(|| DEFAULT_HTTP_ADDR.parse().expect("valid default address")),
            model,
            log_json: s.log_json,
            served_model_name: s.served_model_name,
            tenants,
            decode: s.decode,
            prefill: s.prefill,
            max_body_bytes: s.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES),
            max_concurrency,
            tenant_max_concurrency: s.tenant_max_concurrency,
            request_timeout: s.request_timeout,
            worker_keepalive: s.worker_keepalive.unwrap_or(DEFAULT_WORKER_KEEPALIVE),
            info_interval,
            info_timeout: info_interval.clamp(Duration::from_millis(200), Duration::from_secs(2)),
            connect_timeout: Duration::from_secs(1),
            abort_timeout: s.abort_timeout.unwrap_or(Duration::from_secs(2)),
            auditor: s.auditor.map(with_scheme),
            receipt_key: s.receipt_key,
            recompute_rate: s.recompute_rate.unwrap_or(DEFAULT_RECOMPUTE_RATE),
            tls,
            edge,
        })
    }

    /// The settings handlers read.
    pub fn settings(&self) -> Settings {
        Settings {
            max_body_bytes: self.max_body_bytes,
            max_concurrency: self.max_concurrency,
            tenant_max_concurrency: self.tenant_max_concurrency,
            dispatch: DispatchConfig {
                request_timeout: self.request_timeout,
                abort_timeout: self.abort_timeout,
                // Two keep-alive periods: the channel's own ping has failed by then, and so has
                // every Info poll since.
                decode_unresponsive: self.worker_keepalive * 2,
            },
            info_interval: self.info_interval,
            recompute_rate: self.recompute_rate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("router.toml");
        std::fs::write(
            &cfg,
            r#"
model = "m.gguf"
decode = ["127.0.0.1:1"]
prefill = ["127.0.0.1:2"]
max_concurrency = 3
request_timeout = "10s"
[[tenants]]
name = "a"
key_sha256 = ["3ebb1c99b12b77463e97c3a0f206e4fd46176cd1b8e183816a67338c04b25e5b"]
"#,
        )
        .unwrap();
        let args = Args::parse_from([
            "r",
            "--config",
            cfg.to_str().unwrap(),
            "--max-concurrency",
            "7",
            "--decode",
            "127.0.0.1:9",
            "--decode",
            "127.0.0.1:10",
        ]);
        // No other test of this crate sets or reads PAGEWARDEN_ROUTER_* variables.
        std::env::set_var("PAGEWARDEN_ROUTER_REQUEST_TIMEOUT", "20s");
        std::env::set_var("PAGEWARDEN_ROUTER_MAX_CONCURRENCY", "5");
        let c = RouterConfig::resolve(args.clone());
        std::env::remove_var("PAGEWARDEN_ROUTER_REQUEST_TIMEOUT");
        std::env::remove_var("PAGEWARDEN_ROUTER_MAX_CONCURRENCY");
        let c = c.unwrap();
        assert_eq!(c.max_concurrency, 7, "the flag wins over the environment");
        assert_eq!(
            c.request_timeout,
            Some(Duration::from_secs(20)),
            "the environment wins over the file"
        );
        let c = RouterConfig::resolve(args).unwrap();
        assert_eq!(c.max_concurrency, 7);
        assert_eq!(c.decode.len(), 2);
        assert_eq!(c.prefill, vec!["127.0.0.1:2".to_string()]);
        assert_eq!(c.request_timeout, Some(Duration::from_secs(10)));
        assert_eq!(c.tenants.inline.len(), 1);
        assert!(RouterConfig::resolve(Args::parse_from(["r"])).is_err());
        std::fs::write(&cfg, "request_timeout = 10\n").unwrap();
        let e = RouterConfig::resolve(Args::parse_from(["r", "--config", cfg.to_str().unwrap()]))
            .unwrap_err();
        assert!(e.to_string().contains("request_timeout"), "{e}");
    }
}
