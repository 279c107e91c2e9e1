//! Worker configuration: a TOML file and command-line flags, flags winning, with defaults that
//! run every service on one machine.
//!
//! Both worker binaries (`pagewarden-prefill`, `pagewarden-decode`) flatten [`WorkerFlags`] into
//! their clap parser, then call [`WorkerConfig::resolve`] with their role's [`WorkerDefaults`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::seal_mode::SealMode;
use crate::tls::{InternalTls, TlsError, TlsFlags, TlsKeys};

/// A configuration file that could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this service.
    #[error("invalid config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: toml::de::Error,
    },
    /// Flags and file together name no model.
    #[error("no model: pass --model PATH (or env PAGEWARDEN_MODEL) or --tiny-test-model SEED")]
    NoModel,
    /// Both pool sizes were given.
    #[error("give at most one of --pool-tokens and --pool-bytes")]
    PoolSizeTwice,
    /// The internal TLS files are incomplete or unreadable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A size that must be positive was zero.
    #[error("{field} must be greater than zero")]
    Zero {
        /// The flag or key.
        field: &'static str,
    },
}

/// Reads a TOML file into `T`; `None` gives `T::default()`.
pub fn load_toml<T: DeserializeOwned + Default>(path: Option<&Path>) -> Result<T, ConfigError> {
    let Some(path) = path else {
        return Ok(T::default());
    };
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// Flags shared by the prefill and decode workers. Every value is optional so that the file
/// (and then the role's defaults) can fill what the command line leaves out.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct WorkerFlags {
    /// TOML file with the same keys as the flags (snake_case).
    #[arg(long, env = "PAGEWARDEN_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address (port 0 picks a free port).
    #[arg(long)]
    pub grpc_addr: Option<SocketAddr>,
    /// Prometheus `/metrics` listen address.
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// KV transfer listener address (decode only).
    #[arg(long)]
    pub transfer_addr: Option<SocketAddr>,
    /// GGUF model file.
    #[arg(long, env = "PAGEWARDEN_MODEL")]
    pub model: Option<PathBuf>,
    /// Use the seeded tiny test model instead of a model file (tests only).
    #[arg(long, value_name = "SEED")]
    pub tiny_test_model: Option<u64>,
    /// KV pool size in tokens.
    #[arg(long)]
    pub pool_tokens: Option<usize>,
    /// KV pool size in bytes (rounded down to whole pages).
    #[arg(long)]
    pub pool_bytes: Option<usize>,
    /// Tokens per KV page.
    #[arg(long)]
    pub page_size: Option<usize>,
    /// Advertised context length (defaults to the model's).
    #[arg(long)]
    pub context_length: Option<usize>,
    /// When the pool cannot hold the context, advertise the pool's size instead of refusing to start.
    #[arg(long)]
    pub lower_context_to_fit: bool,
    /// Node id reported in `Info` and in integrity events.
    #[arg(long)]
    pub node_id: Option<String>,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
    /// Threads for the model's matmuls (0 = all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Most requests in flight at once (prefill: concurrent forward passes; decode: batch size).
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Prompt tokens per prefill chunk.
    #[arg(long)]
    pub chunk_tokens: Option<usize>,
    /// How long a write grant stays valid before an uncommitted reservation is aborted (ms).
    #[arg(long)]
    pub grant_ttl_ms: Option<u64>,
    /// How long a revoked grant may wait for its drain before its pages are quarantined (ms).
    #[arg(long)]
    pub drain_timeout_ms: Option<u64>,
    /// Zero pages when they return to the free list.
    #[arg(long)]
    pub zero_on_release: bool,
    /// Decode: on commit, also re-read every landed page and compare it with the checksum
    /// taken as it landed, catching a write that got past the fence after landing (default
    /// true; `false` trusts the fence and saves that pass before the first token). The
    /// sender's checksums are compared with the landed ones either way.
    #[arg(long, value_name = "BOOL")]
    pub commit_rehash: Option<bool>,
    /// Most requests waiting for pages or compute (prefill: passes; decode: reservations);
    /// one more is refused with RESOURCE_EXHAUSTED `queue_full` (the router's 503).
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// How long a request may wait in that queue before it is refused with `queue_timeout` (ms).
    #[arg(long)]
    pub queue_timeout_ms: Option<u64>,
    /// Decode: seal every KV transfer frame under a per-grant secret that travels inside the
    /// grant (over gRPC, under mutual TLS), instead of TLS on the transfer stream: `mac`
    /// authenticates frames and page bytes, `aead` also encrypts the page bytes. Unset: TLS on
    /// the stream when TLS files are given, as gRPC.
    #[arg(long, value_enum)]
    pub transfer_seal: Option<SealMode>,
    /// Internal mutual TLS (gRPC and KV transfer).
    #[command(flatten)]
    pub tls: TlsFlags,
    /// Serve gRPC and KV transfer in clear on a non-loopback address, unauthenticated. Without
    /// TLS files only loopback addresses are served otherwise.
    #[arg(long)]
    pub insecure_internal: bool,
}

/// The same keys as [`WorkerFlags`], read from the TOML file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerFile {
    /// See [`WorkerFlags::grpc_addr`].
    pub grpc_addr: Option<SocketAddr>,
    /// See [`WorkerFlags::metrics_addr`].
    pub metrics_addr: Option<SocketAddr>,
    /// See [`WorkerFlags::transfer_addr`].
    pub transfer_addr: Option<SocketAddr>,
    /// See [`WorkerFlags::model`].
    pub model: Option<PathBuf>,
    /// See [`WorkerFlags::tiny_test_model`].
    pub tiny_test_model: Option<u64>,
    /// See [`WorkerFlags::pool_tokens`].
    pub pool_tokens: Option<usize>,
    /// See [`WorkerFlags::pool_bytes`].
    pub pool_bytes: Option<usize>,
    /// See [`WorkerFlags::page_size`].
    pub page_size: Option<usize>,
    /// See [`WorkerFlags::context_length`].
    pub context_length: Option<usize>,
    /// See [`WorkerFlags::lower_context_to_fit`].
    pub lower_context_to_fit: Option<bool>,
    /// See [`WorkerFlags::node_id`].
    pub node_id: Option<String>,
    /// See [`WorkerFlags::log_json`].
    pub log_json: Option<bool>,
    /// See [`WorkerFlags::threads`].
    pub threads: Option<usize>,
    /// See [`WorkerFlags::max_concurrency`].
    pub max_concurrency: Option<usize>,
    /// See [`WorkerFlags::chunk_tokens`].
    pub chunk_tokens: Option<usize>,
    /// See [`WorkerFlags::grant_ttl_ms`].
    pub grant_ttl_ms: Option<u64>,
    /// See [`WorkerFlags::drain_timeout_ms`].
    pub drain_timeout_ms: Option<u64>,
    /// See [`WorkerFlags::zero_on_release`].
    pub zero_on_release: Option<bool>,
    /// See [`WorkerFlags::commit_rehash`].
    pub commit_rehash: Option<bool>,
    /// See [`WorkerFlags::max_queue`].
    pub max_queue: Option<usize>,
    /// See [`WorkerFlags::queue_timeout_ms`].
    pub queue_timeout_ms: Option<u64>,
    /// See [`WorkerFlags::transfer_seal`].
    pub transfer_seal: Option<SealMode>,
    /// See [`TlsFlags::tls_ca`].
    pub tls_ca: Option<PathBuf>,
    /// See [`TlsFlags::tls_cert`].
    pub tls_cert: Option<PathBuf>,
    /// See [`TlsFlags::tls_key`].
    pub tls_key: Option<PathBuf>,
    /// See [`WorkerFlags::insecure_internal`].
    pub insecure_internal: Option<bool>,
}

/// Per-role defaults (listen ports differ so that every service fits on one machine).
#[derive(Debug, Clone, Copy)]
pub struct WorkerDefaults {
    /// "prefill" or "decode".
    pub role: &'static str,
    /// Default gRPC address.
    pub grpc_addr: SocketAddr,
    /// Default metrics address.
    pub metrics_addr: SocketAddr,
    /// Default transfer address.
    pub transfer_addr: SocketAddr,
}

impl WorkerDefaults {
    /// Prefill: gRPC 127.0.0.1:7101, metrics :7102.
    pub fn prefill() -> Self {
        Self {
            role: "prefill",
            grpc_addr: ([127, 0, 0, 1], 7101).into(),
            metrics_addr: ([127, 0, 0, 1], 7102).into(),
            transfer_addr: ([127, 0, 0, 1], 0).into(),
        }
    }

    /// Decode: gRPC 127.0.0.1:7201, metrics :7202, transfer :7203.
    pub fn decode() -> Self {
        Self {
            role: "decode",
            grpc_addr: ([127, 0, 0, 1], 7201).into(),
            metrics_addr: ([127, 0, 0, 1], 7202).into(),
            transfer_addr: ([127, 0, 0, 1], 7203).into(),
        }
    }
}

/// Where the model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A GGUF file.
    File(PathBuf),
    /// The seeded tiny random Llama used by tests.
    TinyTest(u64),
}

/// How big the KV pool is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSize {
    /// Enough pages for this many tokens (rounded up to whole pages).
    Tokens(usize),
    /// As many whole pages as fit in this many bytes.
    Bytes(usize),
    /// Two full contexts' worth of tokens.
    TwoContexts,
}

/// The resolved configuration of one worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// "prefill" or "decode".
    pub role: &'static str,
    /// gRPC listen address.
    pub grpc_addr: SocketAddr,
    /// Metrics listen address.
    pub metrics_addr: SocketAddr,
    /// Transfer listen address (decode).
    pub transfer_addr: SocketAddr,
    /// The model.
    pub model: ModelSource,
    /// The KV pool's size.
    pub pool: PoolSize,
    /// Tokens per page.
    pub page_size: usize,
    /// Advertised context override.
    pub context_length: Option<usize>,
    /// Lower the advertised context to fit the pool instead of refusing to start (I7).
    pub lower_context_to_fit: bool,
    /// Node id.
    pub node_id: String,
    /// JSON logs.
    pub log_json: bool,
    /// Model threads (0 = all cores).
    pub threads: usize,
    /// Concurrency bound.
    pub max_concurrency: usize,
    /// Prefill chunk size in tokens.
    pub chunk_tokens: usize,
    /// Grant lifetime.
    pub grant_ttl: Duration,
    /// Drain timeout before quarantine.
    pub drain_timeout: Duration,
    /// Zero pages on release.
    pub zero_on_release: bool,
    /// Re-hash landed pages on commit (decode).
    pub commit_rehash: bool,
    /// Bound on the waiting queue.
    pub max_queue: usize,
    /// Bound on one request's wait in that queue.
    pub queue_timeout: Duration,
    /// Decode's transfer listener seals frames this way instead of speaking TLS.
    pub transfer_seal: Option<SealMode>,
    /// Internal mutual TLS, or plaintext.
    pub tls: InternalTls,
    /// Plaintext allowed on non-loopback listeners.
    pub insecure_internal: bool,
}

impl WorkerConfig {
    /// Merges flags over the file (if any) over the role's defaults.
    pub fn resolve(flags: WorkerFlags, defaults: WorkerDefaults) -> Result<Self, ConfigError> {
        let file: WorkerFile = load_toml(flags.config.as_deref())?;
        let tls = InternalTls::load(&flags.tls.clone().over(TlsKeys {
            tls_ca: file.tls_ca.clone(),
            tls_cert: file.tls_cert.clone(),
            tls_key: file.tls_key.clone(),
        }))?;
        let model = match (
            flags.tiny_test_model.or(file.tiny_test_model),
            flags.model.or(file.model),
        ) {
            (Some(seed), _) => ModelSource::TinyTest(seed),
            (None, Some(path)) => ModelSource::File(path),
            (None, None) => return Err(ConfigError::NoModel),
        };
        let pool = match (
            flags.pool_tokens.or(file.pool_tokens),
            flags.pool_bytes.or(file.pool_bytes),
        ) {
            (Some(_), Some(_)) => return Err(ConfigError::PoolSizeTwice),
            (Some(0), None) => {
                return Err(ConfigError::Zero {
                    field: "pool_tokens",
                })
            }
            (None, Some(0)) => {
                return Err(ConfigError::Zero {
                    field: "pool_bytes",
                })
            }
            (Some(t), None) => PoolSize::Tokens(t),
            (None, Some(b)) => PoolSize::Bytes(b),
            (None, None) => PoolSize::TwoContexts,
        };
        let page_size = flags.page_size.or(file.page_size).unwrap_or(16);
        if page_size == 0 {
            return Err(ConfigError::Zero { field: "page_size" });
        }
        let max_concurrency = flags.max_concurrency.or(file.max_concurrency).unwrap_or(8);
        if max_concurrency == 0 {
            return Err(ConfigError::Zero {
                field: "max_concurrency",
            });
        }
        let chunk_tokens = flags.chunk_tokens.or(file.chunk_tokens).unwrap_or(256);
        if chunk_tokens == 0 {
            return Err(ConfigError::Zero {
                field: "chunk_tokens",
            });
        }
        Ok(Self {
            role: defaults.role,
            grpc_addr: flags
                .grpc_addr
                .or(file.grpc_addr)
                .unwrap_or(defaults.grpc_addr),
            metrics_addr: flags
                .metrics_addr
                .or(file.metrics_addr)
                .unwrap_or(defaults.metrics_addr),
            transfer_addr: flags
                .transfer_addr
                .or(file.transfer_addr)
                .unwrap_or(defaults.transfer_addr),
            model,
            pool,
            page_size,
            context_length: flags.context_length.or(file.context_length),
            lower_context_to_fit: flags.lower_context_to_fit
                || file.lower_context_to_fit.unwrap_or(false),
            node_id: flags
                .node_id
                .or(file.node_id)
                .unwrap_or_else(|| format!("{}-{}", defaults.role, std::process::id())),
            log_json: flags.log_json || file.log_json.unwrap_or(false),
            threads: flags.threads.or(file.threads).unwrap_or(0),
            max_concurrency,
            chunk_tokens,
            grant_ttl: Duration::from_millis(
                flags.grant_ttl_ms.or(file.grant_ttl_ms).unwrap_or(300_000),
            ),
            drain_timeout: Duration::from_millis(
                flags
                    .drain_timeout_ms
                    .or(file.drain_timeout_ms)
                    .unwrap_or(5_000),
            ),
            zero_on_release: flags.zero_on_release || file.zero_on_release.unwrap_or(false),
            commit_rehash: flags.commit_rehash.or(file.commit_rehash).unwrap_or(true),
            max_queue: flags.max_queue.or(file.max_queue).unwrap_or(256),
            queue_timeout: Duration::from_millis(
                flags
                    .queue_timeout_ms
                    .or(file.queue_timeout_ms)
                    .unwrap_or(120_000),
            ),
            transfer_seal: flags.transfer_seal.or(file.transfer_seal),
            tls,
            insecure_internal: flags.insecure_internal || file.insecure_internal.unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_file_and_defaults_fill_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(
            &path,
            "pool_tokens = 100\npage_size = 8\nnode_id = \"file\"\ncommit_rehash = false\n",
        )
        .unwrap();
        let flags = WorkerFlags {
            config: Some(path),
            tiny_test_model: Some(7),
            node_id: Some("flag".into()),
            ..Default::default()
        };
        let cfg = WorkerConfig::resolve(flags, WorkerDefaults::decode()).unwrap();
        assert_eq!(cfg.pool, PoolSize::Tokens(100));
        assert_eq!(cfg.page_size, 8);
        assert_eq!(cfg.node_id, "flag");
        assert_eq!(cfg.model, ModelSource::TinyTest(7));
        assert_eq!(cfg.grpc_addr, WorkerDefaults::decode().grpc_addr);
        assert!(
            !cfg.commit_rehash,
            "the file's commit_rehash = false is lost"
        );
        assert!(!cfg.zero_on_release);
    }

    #[test]
    fn unknown_keys_and_missing_model_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(&path, "pool_tokenz = 1\n").unwrap();
        let flags = WorkerFlags {
            config: Some(path),
            ..Default::default()
        };
        assert!(matches!(
            WorkerConfig::resolve(flags, WorkerDefaults::prefill()),
            Err(ConfigError::Parse { .. })
        ));
        let err = WorkerConfig::resolve(WorkerFlags::default(), WorkerDefaults::prefill());
        // PAGEWARDEN_MODEL is read by clap, not here, so an empty flag set has no model.
        assert!(matches!(err, Err(ConfigError::NoModel)));
    }

    #[test]
    fn both_pool_sizes_is_an_error() {
        let flags = WorkerFlags {
            tiny_test_model: Some(1),
            pool_tokens: Some(10),
            pool_bytes: Some(10),
            ..Default::default()
        };
        assert!(matches!(
            WorkerConfig::resolve(flags, WorkerDefaults::prefill()),
            Err(ConfigError::PoolSizeTwice)
        ));
    }
}
