//! Configuration: an optional TOML file, overridden by command-line flags.
//!
//! ```toml
//! http_addr = "127.0.0.1:7401"
//! grpc_addr = "127.0.0.1:7400"
//! database_url = "postgres://auditor@127.0.0.1/pagewarden"   # default: SQLite in data_dir
//! data_dir = "data"
//! router_url = "http://127.0.0.1:8080"
//! probe_interval = "5m"                                        # "0s" turns probing off
//! probe_sweep = "full"           # what each scheduled run sends: "light" or "full"
//! probe_tenants = [{ tenant = "probe-a", api_key = "pw-probe-a" }]
//! recompute_model = "models/SmolLM2-135M-Instruct.Q4_1.gguf"   # the recompute audit (off without)
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
use serde::{Deserialize, Serialize};

pub use pagewarden_common::config::ConfigError;
use pagewarden_common::config::{is_false, layered};
use pagewarden_common::receipt::{BadPublicKey, PublicKey};
use pagewarden_common::tenants::ClientKeys;
use pagewarden_common::tls::{InternalTls, TlsFlags};

use crate::accounts::{Accounts, ApiToken, OperatorAccount};
use crate::domain::SweepKind;
use crate::probe::side_channel::SideChannelSettings;
use crate::probe::ProbeTenant;
use crate::recompute::{RecomputeSettings, DEFAULT_TOLERANCE};
use crate::web::throttle::ThrottleLimits;

/// The auditor's settings: command-line flags, and the keys of the TOML file and of the
/// `PAGEWARDEN_AUDITOR_*` variables. A flag wins over the variable, the variable over the file.
#[derive(Debug, Default, Parser, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[command(
    name = "pagewarden-auditor",
    about = "Pagewarden auditor: probes, integrity events, incident log, web UI"
)]
pub struct Args {
    /// TOML config file.
    #[arg(long, env = "PAGEWARDEN_AUDITOR_CONFIG")]
    #[serde(skip)]
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
    /// File only: probe tenants as `{ tenant = "..", api_key = ".." }` tables.
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub probe_tenants: Vec<ProbeTenant>,
    /// A client keys file (`[[keys]] tenant = "..", key = ".."`, as `pagewarden up` keeps its
    /// dev tenants' keys): every tenant in it is a probe tenant too.
    #[arg(long)]
    pub probe_keys_file: Option<PathBuf>,
    /// Time between probe runs (`90s`, `5m`, `1h`; `0s` turns probing off).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub probe_interval: Option<Duration>,
    /// What each scheduled probe run sends: `light` (per tenant one short prompt and one just
    /// past the context) or `full` (lengths doubling up to the context, then past it).
    /// Default `full`; either can also be started on demand from the Probes page.
    #[arg(long)]
    pub probe_sweep: Option<String>,
    /// `max_tokens` of probe requests (default 4).
    #[arg(long)]
    pub probe_max_tokens: Option<u32>,
    /// First probe length in words, one KV page (default 16).
    #[arg(long)]
    pub probe_page_size: Option<u32>,
    /// The least first-token limit of a probe step (default `60s`): a step whose prompt takes
    /// longer at the pace the prober measured on its recent steps gets 4× that time instead.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub probe_max_ttft: Option<Duration>,
    /// Least plausible prefill time per prompt token, in µs (default 0: no lower bound).
    #[arg(long)]
    pub probe_min_prefill_us_per_token: Option<u64>,
    /// Bound on each probe request (default `2m`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub probe_request_timeout: Option<Duration>,
    /// Rounds of the side-channel audit each probe run ends with (4 requests each; 0: off).
    #[arg(long)]
    pub side_channel_rounds: Option<u32>,
    /// Rounds of the side-channel audit's scheduling-order check (6 requests each; 0: off).
    #[arg(long)]
    pub side_channel_order_rounds: Option<u32>,
    /// The side-channel audit's p-value below which an incident opens.
    #[arg(long)]
    pub side_channel_threshold: Option<f64>,
    /// GGUF model whose tokenizer gives exact prompt token counts for probes.
    #[arg(long, env = "PAGEWARDEN_MODEL")]
    pub model_path: Option<PathBuf>,
    /// The recompute audit: the GGUF model the workers serve, loaded here to score sampled
    /// requests again on a clean pass (off without it).
    #[arg(long, value_name = "PATH")]
    pub recompute_model: Option<PathBuf>,
    /// How far (nats) a served token's logprob may be from the clean pass's (default 1).
    #[arg(long, value_name = "NATS")]
    pub recompute_tolerance: Option<f32>,
    /// Internal mutual TLS of the gRPC listener.
    #[command(flatten)]
    #[serde(flatten)]
    pub tls: TlsFlags,
    /// Serve gRPC in clear on a non-loopback address, unauthenticated.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub insecure_internal: bool,
    /// Mark the web UI's session cookies `Secure` (it is served under TLS, e.g. by a proxy).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub secure_cookies: bool,
    /// Longest wait a run of failed sign-ins backs off to, per address and per name (`5m`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub sign_in_max_backoff: Option<Duration>,
    /// Log JSON lines instead of text.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub log_json: bool,
    /// The public half of the routers' receipt key (64 hex digits), served unauthenticated at
    /// `/api/receipt-key` for `pagewarden verify-receipt`.
    #[arg(long, value_name = "HEX")]
    pub receipt_public_key: Option<String>,
    /// File only: web UI accounts (see `accounts`).
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub operators: Vec<OperatorAccount>,
    /// File only: JSON API tokens (see `accounts`).
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub api_tokens: Vec<ApiToken>,
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
    /// The least first-token limit of a step (the pace may raise it).
    pub probe_max_ttft: Duration,
    /// Lower prefill bound per prompt token (µs; 0 = none).
    pub probe_min_prefill_us_per_token: u64,
    /// Per-request timeout.
    pub probe_request_timeout: Duration,
    /// The side-channel audit of every probe run.
    pub side_channel: SideChannelSettings,
    /// Tokenizer source.
    pub model_path: Option<PathBuf>,
    /// The recompute audit, when a model is given for it.
    pub recompute: Option<RecomputeSettings>,
    /// Internal mutual TLS of the gRPC listener, or plaintext.
    pub tls: InternalTls,
    /// Plaintext gRPC allowed on a non-loopback address.
    pub insecure_internal: bool,
    /// Web UI accounts and JSON API tokens (hashes only).
    pub accounts: Accounts,
    /// The web UI is served under TLS: session cookies are marked `Secure`.
    pub secure_cookies: bool,
    /// Back-off of failed sign-ins.
    pub sign_in: ThrottleLimits,
    /// Log JSON lines instead of text.
    pub log_json: bool,
    /// The routers' receipt verification key, when receipts are signed.
    pub receipt_public_key: Option<PublicKey>,
}

/// The side-channel audit's settings: the defaults, where not given; a threshold must be a
/// probability above 0 and below 1.
fn side_channel(
    rounds: Option<u32>,
    order_rounds: Option<u32>,
    threshold: Option<f64>,
) -> Result<SideChannelSettings, ConfigError> {
    let d = SideChannelSettings::default();
    let threshold = threshold.unwrap_or(d.threshold);
    if !(threshold > 0.0 && threshold < 1.0) {
        return Err(ConfigError::Invalid(format!(
            "side_channel_threshold must be between 0 and 1 (exclusive), got {threshold}"
        )));
    }
    Ok(SideChannelSettings {
        rounds: rounds.unwrap_or(d.rounds),
        order_rounds: order_rounds.unwrap_or(d.order_rounds),
        threshold,
    })
}

/// The recompute audit's settings, when a model is given; a tolerance must be a finite
/// number of nats above 0.
fn recompute(
    model: Option<PathBuf>,
    tolerance: Option<f32>,
) -> Result<Option<RecomputeSettings>, ConfigError> {
    let tolerance = tolerance.unwrap_or(DEFAULT_TOLERANCE);
    if !(tolerance.is_finite() && tolerance > 0.0) {
        return Err(ConfigError::Invalid(format!(
            "recompute_tolerance must be a finite number of nats above 0, got {tolerance}"
        )));
    }
    Ok(model.map(|model| RecomputeSettings { model, tolerance }))
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
    /// Merges the flags over the `PAGEWARDEN_AUDITOR_*` variables over the file named by
    /// `args.config` (if any) over the defaults.
    pub fn load(args: Args) -> Result<Self, ConfigError> {
        Self::resolve(layered(
            &args,
            args.config.as_deref(),
            "PAGEWARDEN_AUDITOR_",
        )?)
    }

    fn resolve(s: Args) -> Result<Self, ConfigError> {
        let data_dir = s.data_dir.unwrap_or_else(|| PathBuf::from("data"));
        let database_url = match s.database_url {
            Some(u) => u,
            None => format!("sqlite://{}/auditor.sqlite?mode=rwc", data_dir.display()),
        };
        // File entries, then the keys file, then flags; a tenant named twice probes once,
        // with the last key given.
        let mut probe_tenants = s.probe_tenants;
        if let Some(path) = s.probe_keys_file {
            for k in ClientKeys::load(&path)?.keys {
                probe_tenants.push(ProbeTenant {
                    tenant: k.tenant,
                    api_key: k.key,
                });
            }
        }
        for k in &s.probe_keys {
            probe_tenants.push(parse_probe_key(k)?);
        }
        let mut seen = std::collections::HashSet::new();
        probe_tenants.reverse();
        probe_tenants.retain(|t| seen.insert(t.tenant.clone()));
        probe_tenants.reverse();
        let probe_interval = s.probe_interval.unwrap_or(Duration::from_secs(300));
        let probe_sweep = match s.probe_sweep {
            Some(k) => k.trim().parse::<SweepKind>().map_err(|_| {
                ConfigError::Invalid(format!("bad probe sweep {k:?} (light or full)"))
            })?,
            None => SweepKind::Full,
        };
        Ok(Config {
            http_addr: s
                .http_addr
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7401))),
            grpc_addr: s
                .grpc_addr
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7400))),
            database_url,
            router_url: s.router_url.map(|u| u.trim_end_matches('/').to_string()),
            probe_tenants,
            probe_interval: (!probe_interval.is_zero()).then_some(probe_interval),
            probe_sweep,
            probe_max_tokens: s.probe_max_tokens.unwrap_or(4),
            probe_page_size: s.probe_page_size.unwrap_or(16),
            probe_max_ttft: s.probe_max_ttft.unwrap_or(Duration::from_secs(60)),
            probe_min_prefill_us_per_token: s.probe_min_prefill_us_per_token.unwrap_or(0),
            side_channel: side_channel(
                s.side_channel_rounds,
                s.side_channel_order_rounds,
                s.side_channel_threshold,
            )?,
            probe_request_timeout: s.probe_request_timeout.unwrap_or(Duration::from_secs(120)),
            model_path: s.model_path,
            recompute: recompute(s.recompute_model, s.recompute_tolerance)?,
            tls: InternalTls::load(&s.tls)?,
            insecure_internal: s.insecure_internal,
            accounts: Accounts::new(&s.operators, &s.api_tokens)
                .map_err(|e| ConfigError::Invalid(e.to_string()))?,
            secure_cookies: s.secure_cookies,
            sign_in: ThrottleLimits {
                max_backoff: s
                    .sign_in_max_backoff
                    .unwrap_or(ThrottleLimits::default().max_backoff),
                ..ThrottleLimits::default()
            },
            log_json: s.log_json,
            receipt_public_key: s
                .receipt_public_key
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(|e: BadPublicKey| {
                    ConfigError::Invalid(format!("receipt_public_key: {e}"))
                })?,
        })
    }

    /// A config for tests: loopback port 0 everywhere, the given database, probing off.
    pub fn for_tests(database_url: &str) -> Self {
        let mut c = Self::resolve(Args::default())
            .unwrap_or_else(|_| unreachable!("defaults always parse"));
        c.http_addr = SocketAddr::from(([127, 0, 0, 1], 0));
        c.grpc_addr = SocketAddr::from(([127, 0, 0, 1], 0));
        c.database_url = database_url.to_string();
        c.probe_interval = None;
        c
    }

    /// The directory of a `sqlite://` file URL, to create before connecting.
    pub fn sqlite_dir(&self) -> Option<PathBuf> {
        self.sqlite_file()?.parent().map(PathBuf::from)
    }

    /// The SQLite database file, when the database is a SQLite file.
    pub fn sqlite_file(&self) -> Option<PathBuf> {
        let rest = self.database_url.strip_prefix("sqlite://")?;
        let path = rest.split('?').next()?;
        if path.contains(":memory:") || path.is_empty() {
            return None;
        }
        Some(PathBuf::from(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auditor.toml");
        std::fs::write(
            &path,
            "grpc_addr = \"127.0.0.1:1\"\nprobe_interval = \"5m\"\nprobe_max_ttft = \"2s\"\n\
             probe_tenants = [{ tenant = \"a\", api_key = \"k\" }]",
        )
        .unwrap();
        let a = Args {
            config: Some(path.clone()),
            grpc_addr: Some("127.0.0.1:2".parse().unwrap()),
            probe_keys: vec!["b=k2".into()],
            ..Args::default()
        };
        let c = Config::load(a).unwrap();
        assert_eq!(c.probe_max_ttft, Duration::from_secs(2));
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
        let c = Config::resolve(a).unwrap();
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
        let e = Config::resolve(a).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
    }

    #[test]
    fn the_scheduled_sweep_is_named_by_flag_or_file() {
        let f: Args = toml::from_str("probe_sweep = \"light\"").unwrap();
        assert_eq!(Config::resolve(f).unwrap().probe_sweep, SweepKind::Light);
        let a = Args {
            probe_sweep: Some("full".into()),
            ..Args::default()
        };
        assert_eq!(Config::resolve(a).unwrap().probe_sweep, SweepKind::Full);
        let a = Args {
            probe_sweep: Some("medium".into()),
            ..Args::default()
        };
        let e = Config::resolve(a).unwrap_err();
        assert!(e.to_string().contains("light or full"), "{e}");
    }

    #[test]
    fn intervals_and_keys() {
        let interval = |s: &str| {
            let a = Args::try_parse_from(["auditor", "--probe-interval", s]).map_err(|_| ())?;
            Config::resolve(a).map(|c| c.probe_interval).map_err(|_| ())
        };
        assert_eq!(interval("0s"), Ok(None));
        assert_eq!(interval("90s"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(interval("1h"), Ok(Some(Duration::from_secs(3600))));
        assert!(interval("soon").is_err());
        assert!(parse_probe_key("nokey").is_err());
    }
}
