//! Worker configuration: flags over `PAGEWARDEN_PREFILL_*` / `PAGEWARDEN_DECODE_*` variables over
//! a TOML file ([`crate::config::layered`]), with defaults that run every service on one machine.
//!
//! Both worker binaries (`pagewarden-prefill`, `pagewarden-decode`) flatten [`WorkerFlags`] into
//! their clap parser, then call [`WorkerConfig::resolve`] with their role's [`WorkerDefaults`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{is_false, layered, nonzero, ConfigError, ModelSource};
use crate::seal_mode::SealMode;
use crate::secret::SecretHash;
use crate::tls::{InternalTls, TlsFlags};

/// Settings shared by the prefill and decode workers, as flags and as the keys of the TOML file
/// (snake_case) and of the `PAGEWARDEN_<ROLE>_*` variables. Every value is optional so that the
/// lower layers (and then the role's defaults) can fill what the command line leaves out.
#[derive(clap::Args, Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerFlags {
    /// TOML file with the same keys as the flags (snake_case).
    #[arg(long, env = "PAGEWARDEN_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// gRPC listen address (port 0 picks a free port).
    #[arg(long)]
    pub grpc_addr: Option<SocketAddr>,
    /// Prometheus `/metrics` listen address. Off loopback only with a metrics token.
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// A bearer token every `/metrics` scrape must present (`Authorization: Bearer TOKEN`; at
    /// least 16 characters); required to serve metrics on a non-loopback address. Better given
    /// as `PAGEWARDEN_PREFILL_METRICS_TOKEN` / `PAGEWARDEN_DECODE_METRICS_TOKEN` than on the
    /// command line, where other users of the host can read it.
    #[arg(long, value_name = "TOKEN")]
    pub metrics_token: Option<String>,
    /// A file holding the metrics token (surrounding whitespace ignored), instead of
    /// `--metrics-token`: what a container mounts from a secret.
    #[arg(long, value_name = "FILE")]
    pub metrics_token_file: Option<PathBuf>,
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
    #[serde(skip_serializing_if = "is_false")]
    pub lower_context_to_fit: bool,
    /// Node id reported in `Info` and in integrity events.
    #[arg(long)]
    pub node_id: Option<String>,
    /// Log as JSON lines.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub log_json: bool,
    /// Threads for the model's matmuls (0 = all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Attention in llama.cpp's flash-attention arithmetic (`llama-server -fa on`, its default
    /// on a CPU: values accumulated in f16, online softmax) instead of its plain CPU attention,
    /// for the same greedy text as such a server; slower. CPU only. Prefill and decode of one
    /// suite must agree.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub flash_attention: bool,
    /// Most requests in flight at once (prefill: concurrent forward passes, default 8; decode:
    /// sequences per decode step, default 256).
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Prompt tokens per prefill chunk.
    #[arg(long)]
    pub chunk_tokens: Option<usize>,
    /// How long a write grant may go without a landed write (since it was issued or its last
    /// write) before the uncommitted reservation is aborted (`5m`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub grant_ttl: Option<Duration>,
    /// How long a revoked grant may wait for its drain before its pages are quarantined (`5s`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Option<Duration>,
    /// Zero pages when they return to the free list.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
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
    /// How long a request may wait in that queue before it is refused with `queue_timeout`
    /// (`2m`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub queue_timeout: Option<Duration>,
    /// Prompt tokens of KV each prefix-cache namespace may keep cached after its requests end
    /// (whole pages; least recently used first beyond it; cached pages no request reads are
    /// given up whenever an allocation needs them). Prefill then computes, and decode is sent,
    /// only what follows a cached prefix. CPU workers only. Default: one advertised context;
    /// 0 turns the prefix cache off.
    #[arg(long, value_name = "TOKENS")]
    pub prefix_cache_tokens: Option<usize>,
    /// Decode: seal every KV transfer frame under a per-grant secret that travels inside the
    /// grant (over gRPC, under mutual TLS), instead of TLS on the transfer stream: `mac`
    /// authenticates frames and page bytes, `aead` also encrypts the page bytes. Unset: TLS on
    /// the stream when TLS files are given, as gRPC.
    #[arg(long, value_name = "mac|aead")]
    pub transfer_seal: Option<SealMode>,
    /// Internal mutual TLS (gRPC and KV transfer).
    #[command(flatten)]
    #[serde(flatten)]
    pub tls: TlsFlags,
    /// Serve gRPC and KV transfer in clear on a non-loopback address, unauthenticated. Without
    /// TLS files only loopback addresses are served otherwise.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub insecure_internal: bool,
}

/// Per-role defaults (listen ports differ so that every service fits on one machine).
#[derive(Debug, Clone, Copy)]
pub struct WorkerDefaults {
    /// "prefill" or "decode".
    pub role: &'static str,
    /// The prefix of this role's environment variables.
    pub env_prefix: &'static str,
    /// Default gRPC address.
    pub grpc_addr: SocketAddr,
    /// Default metrics address.
    pub metrics_addr: SocketAddr,
    /// Default transfer address.
    pub transfer_addr: SocketAddr,
    /// Default `--max-concurrency`: prefill's prompts computing at once; decode's batch.
    pub max_concurrency: usize,
}

impl WorkerDefaults {
    /// Prefill: gRPC 127.0.0.1:7101, metrics :7102.
    pub fn prefill() -> Self {
        Self {
            role: "prefill",
            env_prefix: "PAGEWARDEN_PREFILL_",
            grpc_addr: ([127, 0, 0, 1], 7101).into(),
            metrics_addr: ([127, 0, 0, 1], 7102).into(),
            transfer_addr: ([127, 0, 0, 1], 0).into(),
            // Admitted prompts take turns a chunk at a time on one engine; more of them only
            // hold more pages.
            max_concurrency: 8,
        }
    }

    /// Decode: gRPC 127.0.0.1:7201, metrics :7202, transfer :7203.
    pub fn decode() -> Self {
        Self {
            role: "decode",
            env_prefix: "PAGEWARDEN_DECODE_",
            grpc_addr: ([127, 0, 0, 1], 7201).into(),
            metrics_addr: ([127, 0, 0, 1], 7202).into(),
            transfer_addr: ([127, 0, 0, 1], 7203).into(),
            // Every running sequence in one step, as vLLM's `max_num_seqs` (256): a step reads
            // the weights once for its whole batch, so a bound below the streams served only
            // makes them take turns; the pool bounds the batch before this does (a sequence
            // that gets no page is preempted).
            max_concurrency: 256,
        }
    }
}

/// How big the KV pool is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSize {
    /// Enough pages for this many tokens (rounded up to whole pages).
    Tokens(usize),
    /// As many whole pages as fit in this many bytes.
    Bytes(usize),
    /// Two full contexts' worth of tokens (of the context the worker advertises:
    /// `context_length` when set, else the model's).
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
    /// The hash of the bearer token `/metrics` requires, if any.
    pub metrics_token: Option<SecretHash>,
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
    /// llama.cpp's flash-attention arithmetic.
    pub flash_attention: bool,
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
    /// Prefix-cache quota per namespace in tokens (`None`: one advertised context; 0: off).
    pub prefix_cache_tokens: Option<usize>,
    /// Decode's transfer listener seals frames this way instead of speaking TLS.
    pub transfer_seal: Option<SealMode>,
    /// Internal mutual TLS, or plaintext.
    pub tls: InternalTls,
    /// Plaintext allowed on non-loopback listeners.
    pub insecure_internal: bool,
}

impl WorkerConfig {
    /// Merges flags over the role's environment variables over the file (if any) over the
    /// role's defaults.
    pub fn resolve(flags: WorkerFlags, defaults: WorkerDefaults) -> Result<Self, ConfigError> {
        let s: WorkerFlags = layered(&flags, flags.config.as_deref(), defaults.env_prefix)?;
        Self::from_settings(s, defaults)
    }

    /// The role's defaults under settings already merged by [`layered`] (a binary that adds its
    /// own keys layers its whole command line, these flags flattened in it).
    pub fn from_settings(s: WorkerFlags, defaults: WorkerDefaults) -> Result<Self, ConfigError> {
        let tls = InternalTls::load(&s.tls)?;
        let model = ModelSource::pick(s.tiny_test_model, s.model)?;
        let pool = match (s.pool_tokens, s.pool_bytes) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::Invalid(
                    "give at most one of --pool-tokens and --pool-bytes".into(),
                ))
            }
            (Some(t), None) => PoolSize::Tokens(nonzero("pool_tokens", t)?),
            (None, Some(b)) => PoolSize::Bytes(nonzero("pool_bytes", b)?),
            (None, None) => PoolSize::TwoContexts,
        };
        let page_size = nonzero("page_size", s.page_size.unwrap_or(16))?;
        let max_concurrency = nonzero(
            "max_concurrency",
            s.max_concurrency.unwrap_or(defaults.max_concurrency),
        )?;
        let chunk_tokens = nonzero("chunk_tokens", s.chunk_tokens.unwrap_or(256))?;
        let metrics_token = match (s.metrics_token.as_deref(), &s.metrics_token_file) {
            (None, None) => None,
            (Some(token), None) => Some(metrics_token(token)?),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError::Invalid(format!(
                        "cannot read metrics_token_file {}: {e}",
                        path.display()
                    ))
                })?;
                Some(metrics_token(text.trim())?)
            }
            (Some(_), Some(_)) => {
                return Err(ConfigError::Invalid(
                    "give at most one of --metrics-token and --metrics-token-file".into(),
                ))
            }
        };
        Ok(Self {
            role: defaults.role,
            grpc_addr: s.grpc_addr.unwrap_or(defaults.grpc_addr),
            metrics_addr: s.metrics_addr.unwrap_or(defaults.metrics_addr),
            metrics_token,
            transfer_addr: s.transfer_addr.unwrap_or(defaults.transfer_addr),
            model,
            pool,
            page_size,
            context_length: s.context_length,
            lower_context_to_fit: s.lower_context_to_fit,
            node_id: s
                .node_id
                .unwrap_or_else(|| format!("{}-{}", defaults.role, std::process::id())),
            log_json: s.log_json,
            threads: s.threads.unwrap_or(0),
            flash_attention: s.flash_attention,
            max_concurrency,
            chunk_tokens,
            grant_ttl: s.grant_ttl.unwrap_or(Duration::from_secs(300)),
            drain_timeout: s.drain_timeout.unwrap_or(Duration::from_secs(5)),
            zero_on_release: s.zero_on_release,
            commit_rehash: s.commit_rehash.unwrap_or(true),
            max_queue: s.max_queue.unwrap_or(256),
            queue_timeout: s.queue_timeout.unwrap_or(Duration::from_secs(120)),
            prefix_cache_tokens: s.prefix_cache_tokens,
            transfer_seal: s.transfer_seal,
            tls,
            insecure_internal: s.insecure_internal,
        })
    }
}

/// Fewest characters of a metrics token.
pub const METRICS_TOKEN_MIN_CHARS: usize = 16;

/// The hash of a metrics token given in settings, refused when too short to resist guessing.
fn metrics_token(token: &str) -> Result<SecretHash, ConfigError> {
    if token.chars().count() < METRICS_TOKEN_MIN_CHARS {
        return Err(ConfigError::Invalid(format!(
            "metrics_token must be at least {METRICS_TOKEN_MIN_CHARS} characters (a random \
             string, e.g. `openssl rand -hex 16`)"
        )));
    }
    Ok(SecretHash::of(token))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_short_metrics_token_is_refused_and_a_long_one_kept_as_its_hash() {
        let with = |token: &str| WorkerFlags {
            tiny_test_model: Some(1),
            metrics_token: Some(token.into()),
            ..Default::default()
        };
        let err = WorkerConfig::from_settings(with("short"), WorkerDefaults::decode())
            .expect_err("a 5-character token");
        assert!(err.to_string().contains("at least 16 characters"), "{err}");
        let token = "0123456789abcdef";
        let cfg = WorkerConfig::from_settings(with(token), WorkerDefaults::decode()).unwrap();
        assert_eq!(cfg.metrics_token, Some(SecretHash::of(token)));
    }

    #[test]
    fn a_metrics_token_file_is_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics-token");
        std::fs::write(&path, "0123456789abcdef\n").unwrap();
        let flags = |file: &Path, token: Option<&str>| WorkerFlags {
            tiny_test_model: Some(1),
            metrics_token_file: Some(file.to_path_buf()),
            metrics_token: token.map(str::to_string),
            ..Default::default()
        };
        let cfg = WorkerConfig::from_settings(flags(&path, None), WorkerDefaults::prefill());
        assert_eq!(
            cfg.unwrap().metrics_token,
            Some(SecretHash::of("0123456789abcdef"))
        );
        let both = flags(&path, Some("0123456789abcdef"));
        let err = WorkerConfig::from_settings(both, WorkerDefaults::prefill()).unwrap_err();
        assert!(err.to_string().contains("at most one"), "{err}");
        let missing = flags(&dir.path().join("none"), None);
        let err = WorkerConfig::from_settings(missing, WorkerDefaults::prefill()).unwrap_err();
        assert!(err.to_string().contains("none"), "{err}");
    }

    #[test]
    fn flags_win_over_file_and_defaults_fill_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(
            &path,
            "pool_tokens = 100\npage_size = 8\nnode_id = \"file\"\ncommit_rehash = false\n\
             grant_ttl = \"90s\"\nqueue_timeout = \"1m 30s\"\nzero_on_release = true\n",
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
        assert!(
            cfg.zero_on_release,
            "a switch left off hides the file's true"
        );
        assert_eq!(cfg.grant_ttl, Duration::from_secs(90));
        assert_eq!(cfg.queue_timeout, Duration::from_secs(90));
        assert_eq!(cfg.drain_timeout, Duration::from_secs(5), "the default");
    }

    #[test]
    fn the_roles_environment_sits_between_flags_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(
            &path,
            "max_queue = 3\nthreads = 3\ndrain_timeout = \"9s\"\n",
        )
        .unwrap();
        // Only this test sets PAGEWARDEN_PREFILL_* variables; the other tests that resolve a
        // prefill config fail the same way whatever these keys say.
        std::env::set_var("PAGEWARDEN_PREFILL_MAX_QUEUE", "4");
        std::env::set_var("PAGEWARDEN_PREFILL_THREADS", "4");
        std::env::set_var("PAGEWARDEN_PREFILL_DRAIN_TIMEOUT", "250ms");
        let flags = WorkerFlags {
            config: Some(path),
            tiny_test_model: Some(1),
            threads: Some(5),
            ..Default::default()
        };
        let cfg = WorkerConfig::resolve(flags, WorkerDefaults::prefill());
        for k in ["MAX_QUEUE", "THREADS", "DRAIN_TIMEOUT"] {
            std::env::remove_var(format!("PAGEWARDEN_PREFILL_{k}"));
        }
        let cfg = cfg.unwrap();
        assert_eq!(cfg.max_queue, 4, "the environment wins over the file");
        assert_eq!(cfg.threads, 5, "the flag wins over the environment");
        assert_eq!(cfg.drain_timeout, Duration::from_millis(250));
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
            Err(ConfigError::Layers { .. })
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
        let e = WorkerConfig::resolve(flags, WorkerDefaults::prefill()).unwrap_err();
        assert!(e.to_string().contains("at most one"), "{e}");
    }
}
