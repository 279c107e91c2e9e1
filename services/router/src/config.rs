//! Configuration: a toml file (`--config`) overridden by flags. Defaults run on one machine.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

use pagewarden_common::tls::{InternalTls, TlsFlags, TlsKeys};

use crate::dispatch::DispatchConfig;
use crate::edge::EdgeLimits;
use crate::server::Settings;
use crate::tenants::TenantSource;
use pagewarden_common::tenants::TenantEntry;

/// Default listen address.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8080";
/// Default body limit: 2 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 2 << 20;
/// Default concurrency limit.
pub const DEFAULT_MAX_CONCURRENCY: usize = 256;

/// Command-line flags. Each overrides the same key of the `--config` file.
#[derive(Clone, Debug, Default, Parser)]
#[command(
    name = "pagewarden-router",
    about = "Pagewarden's OpenAI-compatible router"
)]
pub struct Args {
    /// toml config file (same keys as the flags, with `_` for `-`; may hold `[[tenants]]`).
    #[arg(long)]
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
    pub log_json: bool,
    /// Name served in /v1/models (default: the model file's stem).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Tenants toml file: `[[tenants]] name = "..", key_sha256 = ["<hex>"]`; reloaded on SIGHUP.
    #[arg(long)]
    pub tenants: Option<PathBuf>,
    /// A decode worker's gRPC URL (repeatable).
    #[arg(long)]
    pub decode: Vec<String>,
    /// A prefill worker's gRPC URL (repeatable).
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
    /// Whole-request deadline (`30s`, `500ms`, `2m`, or seconds).
    #[arg(long, value_parser = parse_duration)]
    pub request_timeout: Option<Duration>,
    /// How often to poll every worker's Info.
    #[arg(long, value_parser = parse_duration)]
    pub info_interval: Option<Duration>,
    /// Bound on each Abort RPC.
    #[arg(long, value_parser = parse_duration)]
    pub abort_timeout: Option<Duration>,
    /// The auditor's gRPC URL; when set, every finished response is sent to it as a sample.
    #[arg(long, env = "PAGEWARDEN_AUDITOR")]
    pub auditor: Option<String>,
    /// Internal mutual TLS towards workers and the auditor (this router's identity).
    #[command(flatten)]
    pub tls: TlsFlags,
    /// Longest wait for a request's head; slower sockets are closed.
    #[arg(long, value_parser = parse_duration)]
    pub header_read_timeout: Option<Duration>,
    /// Longest wait for a request's body after its head (400 past it).
    #[arg(long, value_parser = parse_duration)]
    pub body_read_timeout: Option<Duration>,
    /// Most client connections served at once; more are closed on accept.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Most connections one client address may hold before any request on them carries a
    /// valid API key; more from that address are closed on accept.
    #[arg(long)]
    pub max_unauthenticated_per_addr: Option<usize>,
}

/// The `--config` file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    http_addr: Option<SocketAddr>,
    model: Option<PathBuf>,
    tiny_test_model: Option<u64>,
    log_json: Option<bool>,
    served_model_name: Option<String>,
    tenants_file: Option<PathBuf>,
    #[serde(default)]
    tenants: Vec<TenantEntry>,
    #[serde(default)]
    decode: Vec<String>,
    #[serde(default)]
    prefill: Vec<String>,
    max_body_bytes: Option<usize>,
    max_concurrency: Option<usize>,
    tenant_max_concurrency: Option<usize>,
    request_timeout: Option<String>,
    info_interval: Option<String>,
    abort_timeout: Option<String>,
    auditor: Option<String>,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    header_read_timeout: Option<String>,
    body_read_timeout: Option<String>,
    max_connections: Option<usize>,
    max_unauthenticated_per_addr: Option<usize>,
}

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not valid toml of the expected shape.
    #[error("cannot parse {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// The toml error.
        source: toml::de::Error,
    },
    /// A value is wrong or missing.
    #[error("{0}")]
    Invalid(String),
}

/// Where the model's tokenizer and chat template come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A GGUF file.
    File(PathBuf),
    /// `tiny_llama_gguf(seed)`, for tests without the real model.
    Tiny(u64),
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
    /// Request deadline.
    pub request_timeout: Duration,
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
    /// Internal mutual TLS (this router's client identity), or plaintext.
    pub tls: InternalTls,
    /// Read timeouts and connection cap of the HTTP edge.
    pub edge: EdgeLimits,
}

fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.display().to_string(),
        source,
    })
}

fn duration(key: &str, v: Option<String>) -> Result<Option<Duration>, ConfigError> {
    v.map(|s| parse_duration(&s).map_err(|e| ConfigError::Invalid(format!("{key}: {e}"))))
        .transpose()
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
    /// Resolves flags over the `--config` file over defaults.
    pub fn resolve(args: Args) -> Result<Self, ConfigError> {
        let file: FileConfig = match &args.config {
            Some(p) => read_toml(p)?,
            None => FileConfig::default(),
        };
        let tls = InternalTls::load(&args.tls.over(TlsKeys {
            tls_ca: file.tls_ca,
            tls_cert: file.tls_cert,
            tls_key: file.tls_key,
        }))
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let defaults = EdgeLimits::default();
        let edge = EdgeLimits {
            header_timeout: args
                .header_read_timeout
                .or(duration("header_read_timeout", file.header_read_timeout)?)
                .unwrap_or(defaults.header_timeout),
            body_timeout: args
                .body_read_timeout
                .or(duration("body_read_timeout", file.body_read_timeout)?)
                .unwrap_or(defaults.body_timeout),
            max_connections: args
                .max_connections
                .or(file.max_connections)
                .unwrap_or(defaults.max_connections),
            max_unauthenticated_per_addr: args
                .max_unauthenticated_per_addr
                .or(file.max_unauthenticated_per_addr)
                .unwrap_or(defaults.max_unauthenticated_per_addr),
        };
        if edge.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "--max-connections must be at least 1".into(),
            ));
        }
        if edge.max_unauthenticated_per_addr == 0 {
            return Err(ConfigError::Invalid(
                "--max-unauthenticated-per-addr must be at least 1".into(),
            ));
        }
        let tenants = TenantSource {
            inline: file.tenants,
            file: args.tenants.or(file.tenants_file),
        };
        let pick = |flag: Vec<String>, file: Vec<String>| if flag.is_empty() { file } else { flag };
        let decode = pick(args.decode, file.decode);
        let prefill = pick(args.prefill, file.prefill);
        if decode.is_empty() || prefill.is_empty() {
            return Err(ConfigError::Invalid(
                "at least one --decode and one --prefill worker URL are required".into(),
            ));
        }
        let model = match (
            args.tiny_test_model.or(file.tiny_test_model),
            args.model.or(file.model),
        ) {
            (Some(seed), _) => ModelSource::Tiny(seed),
            (None, Some(path)) => ModelSource::File(path),
            (None, None) => {
                return Err(ConfigError::Invalid(
                    "--model (a GGUF file, or env PAGEWARDEN_MODEL) is required".into(),
                ))
            }
        };
        let max_concurrency = args
            .max_concurrency
            .or(file.max_concurrency)
            .unwrap_or(DEFAULT_MAX_CONCURRENCY);
        if max_concurrency == 0 {
            return Err(ConfigError::Invalid(
                "--max-concurrency must be at least 1".into(),
            ));
        }
        let tenant_max_concurrency = args.tenant_max_concurrency.or(file.tenant_max_concurrency);
        if tenant_max_concurrency == Some(0) {
            return Err(ConfigError::Invalid(
                "--tenant-max-concurrency must be at least 1 (leave it out for no per-tenant \
                 limit)"
                    .into(),
            ));
        }
        let request_timeout = args
            .request_timeout
            .or(duration("request_timeout", file.request_timeout)?)
            .unwrap_or(Duration::from_secs(300));
        let info_interval = args
            .info_interval
            .or(duration("info_interval", file.info_interval)?)
            .unwrap_or(Duration::from_secs(1));
        Ok(Self {
            http_addr: args
                .http_addr
                .or(file.http_addr)
                .unwrap_or_else(|| DEFAULT_HTTP_ADDR.parse().expect("valid default address")),
            model,
            log_json: args.log_json || file.log_json.unwrap_or(false),
            served_model_name: args.served_model_name.or(file.served_model_name),
            tenants,
            decode,
            prefill,
            max_body_bytes: args
                .max_body_bytes
                .or(file.max_body_bytes)
                .unwrap_or(DEFAULT_MAX_BODY_BYTES),
            max_concurrency,
            tenant_max_concurrency,
            request_timeout,
            info_interval,
            info_timeout: info_interval.clamp(Duration::from_millis(200), Duration::from_secs(2)),
            connect_timeout: Duration::from_secs(1),
            abort_timeout: args
                .abort_timeout
                .or(duration("abort_timeout", file.abort_timeout)?)
                .unwrap_or(Duration::from_secs(2)),
            auditor: args.auditor.or(file.auditor).map(with_scheme),
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
            },
            info_interval: self.info_interval,
        }
    }
}

/// Parses `500ms`, `30s`, `2m`, or a bare number of seconds (fractions allowed).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (try 30s, 500ms, 2m)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("`{s}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3d").is_err());
        assert!(parse_duration("-1s").is_err());
    }

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
        let c = RouterConfig::resolve(args).unwrap();
        assert_eq!(c.max_concurrency, 7);
        assert_eq!(c.decode.len(), 2);
        assert_eq!(c.prefill, vec!["127.0.0.1:2".to_string()]);
        assert_eq!(c.request_timeout, Duration::from_secs(10));
        assert_eq!(c.tenants.inline.len(), 1);
        assert!(RouterConfig::resolve(Args::parse_from(["r"])).is_err());
    }
}
