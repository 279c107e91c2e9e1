//! Configuration: an optional TOML file, overridden by command-line flags.
//!
//! ```toml
//! http_addr = "127.0.0.1:7401"
//! grpc_addr = "127.0.0.1:7400"
//! database_url = "postgres://auditor@127.0.0.1/pagewarden"   # default: SQLite in data_dir
//! data_dir = "data"
//! router_url = "http://127.0.0.1:8080"
//! probe_interval = "5m"                                        # "0" turns probing off
//! probe_sweep = "full"           # what each scheduled run sends: "light" or "full"
//! probe_tenants = [{ tenant = "probe-a", api_key = "pw-probe-a" }]
//! probe_keys_file = ".pw/keys.toml"   # every tenant of a client keys file probes too
//! secure_cookies = true          # the web UI is served under TLS (e.g. by a TLS proxy)
//! [[operators]]                  # web UI accounts and JSON API tokens: see `accounts`
//! name = "ana"
//! role = "operator"
//! password_argon2 = "$argon2id$..."
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

use pagewarden_common::tenants::ClientKeys;
use pagewarden_common::tls::{InternalTls, TlsFlags, TlsKeys};

use crate::accounts::{Accounts, ApiToken, OperatorAccount};
use crate::domain::SweepKind;
use crate::probe::ProbeTenant;

/// The configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {0}: {1}")]
    Read(PathBuf, std::io::Error),
    /// The file is not valid TOML for this config.
    #[error("parsing {0}: {1}")]
    Parse(PathBuf, toml::de::Error),
    /// The probe keys file could not be read or parsed.
    #[error("probe keys file: {0}")]
    ProbeKeys(#[from] pagewarden_common::tenants::TenantsError),
    /// A value is malformed.
    #[error("{0}")]
    Invalid(String),
}

/// Command-line flags; each overrides the file's value.
#[derive(Debug, Default, Parser)]
#[command(
    name = "pagewarden-auditor",
    about = "Pagewarden auditor: probes, integrity events, incident log, web UI"
)]
pub struct Args {
    /// TOML config file.
    #[arg(long, env = "PAGEWARDEN_AUDITOR_CONFIG")]
    pub config: Option<PathBuf>,
    /// HTTP listener (web UI, JSON API, /metrics); port 0 picks a free port.
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,
    /// gRPC listener (ingestion); port 0 picks a free port.
    #[arg(long)]
    pub grpc_addr: Option<SocketAddr>,
    /// sqlite:... or postgres://...; default: SQLite file in the data dir.
    #[arg(long, env = "PAGEWARDEN_AUDITOR_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Where the default SQLite file lives.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Router base URL for canary probes.
    #[arg(long)]
    pub router_url: Option<String>,
    /// A probe tenant as `tenant=api_key` (repeatable).
    #[arg(long = "probe-key")]
    pub probe_keys: Vec<String>,
    /// A client keys file (`[[keys]] tenant = "..", key = ".."`, as `pagewarden up` keeps its
    /// dev tenants' keys): every tenant in it is a probe tenant too.
    #[arg(long)]
    pub probe_keys_file: Option<PathBuf>,
    /// Time between probe runs (`90`, `30s`, `5m`, `1h`; `0` turns probing off).
    #[arg(long)]
    pub probe_interval: Option<String>,
    /// What each scheduled probe run sends: `light` (per tenant one short prompt and one just
    /// past the context) or `full` (lengths doubling up to the context, then past it).
    /// Default `full`; either can also be started on demand from the Probes page.
    #[arg(long)]
    pub probe_sweep: Option<String>,
    /// GGUF model whose tokenizer gives exact prompt token counts for probes.
    #[arg(long, env = "PAGEWARDEN_MODEL")]
    pub model_path: Option<PathBuf>,
    /// Internal mutual TLS of the gRPC listener.
    #[command(flatten)]
    pub tls: TlsFlags,
    /// Serve gRPC in clear on a non-loopback address, unauthenticated.
    #[arg(long)]
    pub insecure_internal: bool,
    /// Log JSON lines instead of text.
    #[arg(long)]
    pub log_json: bool,
}

/// The TOML file's shape; every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    http_addr: Option<SocketAddr>,
    grpc_addr: Option<SocketAddr>,
    database_url: Option<String>,
    data_dir: Option<PathBuf>,
    router_url: Option<String>,
    probe_interval: Option<String>,
    probe_sweep: Option<String>,
    probe_tenants: Vec<ProbeTenant>,
    probe_keys_file: Option<PathBuf>,
    probe_max_tokens: Option<u32>,
    probe_page_size: Option<u32>,
    probe_max_ttft_ms: Option<u64>,
    probe_min_prefill_us_per_token: Option<u64>,
    probe_request_timeout_s: Option<u64>,
    model_path: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    insecure_internal: Option<bool>,
    operators: Vec<OperatorAccount>,
    api_tokens: Vec<ApiToken>,
    secure_cookies: Option<bool>,
    log_json: Option<bool>,
}

/// The resolved configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// HTTP listener.
    pub http_addr: SocketAddr,
    /// gRPC listener.
    pub grpc_addr: SocketAddr,
    /// Database URL.
    pub database_url: String,
    /// Router base URL; probing is off without it.
    pub router_url: Option<String>,
    /// Probe tenants.
    pub probe_tenants: Vec<ProbeTenant>,
    /// Time between runs; `None` turns probing off.
    pub probe_interval: Option<Duration>,
    /// What each scheduled run sends.
    pub probe_sweep: SweepKind,
    /// `max_tokens` of probe requests.
    pub probe_max_tokens: u32,
    /// First probe length in words (one KV page).
    pub probe_page_size: u32,
    /// Upper TTFT bound.
    pub probe_max_ttft_ms: u64,
    /// Lower prefill bound per prompt token (µs; 0 = none).
    pub probe_min_prefill_us_per_token: u64,
    /// Per-request timeout.
    pub probe_request_timeout: Duration,
    /// Tokenizer source.
    pub model_path: Option<PathBuf>,
    /// Internal mutual TLS of the gRPC listener, or plaintext.
    pub tls: InternalTls,
    /// Plaintext gRPC allowed on a non-loopback address.
    pub insecure_internal: bool,
    /// Web UI accounts and JSON API tokens (hashes only).
    pub accounts: Accounts,
    /// The web UI is served under TLS: session cookies are marked `Secure`.
    pub secure_cookies: bool,
    /// Log JSON lines instead of text.
    pub log_json: bool,
}

/// Parses `90`, `30s`, `5m`, `1h` into a duration; `0` is `None` (off).
pub fn parse_interval(s: &str) -> Result<Option<Duration>, ConfigError> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 'h')) => (&s[..i], 3600),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| ConfigError::Invalid(format!("bad interval {s:?} (try 30s, 5m, 1h)")))?;
    Ok((n > 0).then(|| Duration::from_secs(n * mult)))
}

fn parse_probe_key(s: &str) -> Result<ProbeTenant, ConfigError> {
    match s.split_once('=') {
        Some((t, k)) if !t.is_empty() && !k.is_empty() => Ok(ProbeTenant {
            tenant: t.to_string(),
            api_key: k.to_string(),
        }),
        _ => Err(ConfigError::Invalid(format!(
            "bad --probe-key {s:?}: expected tenant=api_key"
        ))),
    }
}

impl Config {
    /// Reads the file named by `args.config` (if any) and applies the flags over it.
    pub fn load(args: Args) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|e| ConfigError::Read(p.clone(), e))?;
                toml::from_str(&text).map_err(|e| ConfigError::Parse(p.clone(), e))?
            }
            None => FileConfig::default(),
        };
        Self::merge(file, args)
    }

    fn merge(f: FileConfig, a: Args) -> Result<Self, ConfigError> {
        let data_dir = a
            .data_dir
            .or(f.data_dir)
            .unwrap_or_else(|| PathBuf::from("data"));
        let database_url = match a.database_url.or(f.database_url) {
            Some(u) => u,
            None => format!("sqlite://{}/auditor.sqlite?mode=rwc", data_dir.display()),
        };
        // File entries, then the keys file, then flags; a tenant named twice probes once,
        // with the last key given.
        let mut probe_tenants = f.probe_tenants;
        if let Some(path) = a.probe_keys_file.or(f.probe_keys_file) {
            for k in ClientKeys::load(&path)?.keys {
                probe_tenants.push(ProbeTenant {
                    tenant: k.tenant,
                    api_key: k.key,
                });
            }
        }
        for k in &a.probe_keys {
            probe_tenants.push(parse_probe_key(k)?);
        }
        let mut seen = std::collections::HashSet::new();
        probe_tenants.reverse();
        probe_tenants.retain(|t| seen.insert(t.tenant.clone()));
        probe_tenants.reverse();
        let probe_interval = match a.probe_interval.or(f.probe_interval) {
            Some(s) => parse_interval(&s)?,
            None => Some(Duration::from_secs(300)),
        };
        let probe_sweep = match a.probe_sweep.or(f.probe_sweep) {
            Some(s) => s.trim().parse::<SweepKind>().map_err(|_| {
                ConfigError::Invalid(format!("bad probe sweep {s:?} (light or full)"))
            })?,
            None => SweepKind::Full,
        };
        let tls = InternalTls::load(&a.tls.over(TlsKeys {
            tls_ca: f.tls_ca,
            tls_cert: f.tls_cert,
            tls_key: f.tls_key,
        }))
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        Ok(Config {
            http_addr: a
                .http_addr
                .or(f.http_addr)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7401))),
            grpc_addr: a
                .grpc_addr
                .or(f.grpc_addr)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7400))),
            database_url,
            router_url: a
                .router_url
                .or(f.router_url)
                .map(|u| u.trim_end_matches('/').to_string()),
            probe_tenants,
            probe_interval,
            probe_sweep,
            probe_max_tokens: f.probe_max_tokens.unwrap_or(4),
            probe_page_size: f.probe_page_size.unwrap_or(16),
            probe_max_ttft_ms: f.probe_max_ttft_ms.unwrap_or(60_000),
            probe_min_prefill_us_per_token: f.probe_min_prefill_us_per_token.unwrap_or(0),
            probe_request_timeout: Duration::from_secs(f.probe_request_timeout_s.unwrap_or(120)),
            model_path: a.model_path.or(f.model_path),
            tls,
            insecure_internal: a.insecure_internal || f.insecure_internal.unwrap_or(false),
            accounts: Accounts::new(&f.operators, &f.api_tokens)
                .map_err(|e| ConfigError::Invalid(e.to_string()))?,
            secure_cookies: f.secure_cookies.unwrap_or(false),
            log_json: a.log_json || f.log_json.unwrap_or(false),
        })
    }

    /// A config for tests: loopback port 0 everywhere, the given database, probing off.
    pub fn for_tests(database_url: &str) -> Self {
        let mut c = Self::merge(FileConfig::default(), Args::default())
            .unwrap_or_else(|_| unreachable!("defaults always parse"));
        c.http_addr = SocketAddr::from(([127, 0, 0, 1], 0));
        c.grpc_addr = SocketAddr::from(([127, 0, 0, 1], 0));
        c.database_url = database_url.to_string();
        c.probe_interval = None;
        c
    }

    /// The directory of a `sqlite://` file URL, to create before connecting.
    pub fn sqlite_dir(&self) -> Option<PathBuf> {
        let rest = self.database_url.strip_prefix("sqlite://")?;
        let path = rest.split('?').next()?;
        if path.contains(":memory:") {
            return None;
        }
        PathBuf::from(path).parent().map(PathBuf::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file() {
        let f: FileConfig = toml::from_str(
            "grpc_addr = \"127.0.0.1:1\"\nprobe_interval = \"5m\"\n\
             probe_tenants = [{ tenant = \"a\", api_key = \"k\" }]",
        )
        .unwrap();
        let a = Args {
            grpc_addr: Some("127.0.0.1:2".parse().unwrap()),
            probe_keys: vec!["b=k2".into()],
            ..Args::default()
        };
        let c = Config::merge(f, a).unwrap();
        assert_eq!(c.grpc_addr.port(), 2);
        assert_eq!(c.probe_interval, Some(Duration::from_secs(300)));
        assert_eq!(c.probe_sweep, SweepKind::Full);
        assert_eq!(c.probe_tenants.len(), 2);
        assert!(c.database_url.starts_with("sqlite://data/"));
        assert_eq!(c.sqlite_dir(), Some(PathBuf::from("data")));
    }

    #[test]
    fn a_keys_file_adds_its_tenants_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys.toml");
        std::fs::write(
            &keys,
            "[[keys]]\ntenant = \"dev-alice\"\nkey = \"ka\"\n\
             [[keys]]\ntenant = \"auditor-probe\"\nkey = \"kp-old\"\n",
        )
        .unwrap();
        let a = Args {
            probe_keys_file: Some(keys),
            probe_keys: vec!["auditor-probe=kp".into()],
            ..Args::default()
        };
        let c = Config::merge(FileConfig::default(), a).unwrap();
        let got: Vec<(&str, &str)> = c
            .probe_tenants
            .iter()
            .map(|t| (t.tenant.as_str(), t.api_key.as_str()))
            .collect();
        assert_eq!(got, vec![("dev-alice", "ka"), ("auditor-probe", "kp")]);
        let a = Args {
            probe_keys_file: Some(dir.path().join("missing.toml")),
            ..Args::default()
        };
        let e = Config::merge(FileConfig::default(), a).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
    }

    #[test]
    fn the_scheduled_sweep_is_named_by_flag_or_file() {
        let f: FileConfig = toml::from_str("probe_sweep = \"light\"").unwrap();
        assert_eq!(
            Config::merge(f, Args::default()).unwrap().probe_sweep,
            SweepKind::Light
        );
        let f: FileConfig = toml::from_str("probe_sweep = \"light\"").unwrap();
        let a = Args {
            probe_sweep: Some("full".into()),
            ..Args::default()
        };
        assert_eq!(Config::merge(f, a).unwrap().probe_sweep, SweepKind::Full);
        let a = Args {
            probe_sweep: Some("medium".into()),
            ..Args::default()
        };
        let e = Config::merge(FileConfig::default(), a).unwrap_err();
        assert!(e.to_string().contains("light or full"), "{e}");
    }

    #[test]
    fn intervals_and_keys() {
        assert_eq!(parse_interval("0").unwrap(), None);
        assert_eq!(parse_interval("90").unwrap(), Some(Duration::from_secs(90)));
        assert_eq!(
            parse_interval("1h").unwrap(),
            Some(Duration::from_secs(3600))
        );
        assert!(parse_interval("soon").is_err());
        assert!(parse_probe_key("nokey").is_err());
    }
}
