//! `pagewarden preflight --config FILE`: checks a deployment before it starts. For every worker:
//! the KV pool against the advertised context (I7, the same rule the workers apply at start),
//! the model file and its GGUF version, the declared software version; across workers: one page
//! shape for prefill and decode (pages move between them byte for byte); and the API keys.
//! Prints a table; any failure makes the exit status non-zero.
//!
//! ```toml
//! tenants_file = "tenants.toml"          # and/or inline [[tenants]] name = "..", key_sha256 = [..]
//! [[workers]]
//! name = "decode-0"
//! role = "decode"                        # prefill | decode
//! model = "models/SmolLM2-135M-Instruct.Q4_1.gguf"   # relative to this file
//! pool_tokens = 16384                    # or pool_bytes; default two contexts
//! page_size = 16
//! context_length = 8192                  # default: the model's
//! lower_context_to_fit = false
//! version = "0.1.0"                      # optional: must match this launcher's
//! ```

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use pagewarden_common::preflight::{preflight, PreflightError, PreflightInput};
use pagewarden_kvcache::KvLayout;
use pagewarden_model::{GgufFile, LlamaConfig};
use serde::Deserialize;

use pagewarden_common::tenants::{problems, TenantEntry, TenantsFile};

/// `pagewarden preflight` flags.
#[derive(Debug, clap::Args)]
pub struct PreflightArgs {
    /// TOML file describing the workers and the tenants (see docs/configuration.md).
    #[arg(long)]
    pub config: PathBuf,
}

/// A worker's role.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs prompts, writes KV pages to decode.
    Prefill,
    /// Holds the KV pool, generates tokens.
    Decode,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// One worker of the file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerEntry {
    /// Node name shown in the table.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// GGUF model file.
    pub model: PathBuf,
    /// Pool size in tokens (rounded up to whole pages).
    pub pool_tokens: Option<usize>,
    /// Pool size in bytes (whole pages that fit).
    pub pool_bytes: Option<usize>,
    /// Tokens per page.
    #[serde(default = "default_page_size")]
    pub page_size: usize,
    /// Advertised context override.
    pub context_length: Option<usize>,
    /// Lower the context to the pool instead of refusing to start.
    #[serde(default)]
    pub lower_context_to_fit: bool,
    /// The version this worker runs.
    pub version: Option<String>,
}

fn default_page_size() -> usize {
    pagewarden_kvcache::DEFAULT_PAGE_SIZE
}

/// The preflight file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreflightFile {
    /// Router tenants file, relative to this file.
    pub tenants_file: Option<PathBuf>,
    /// Inline tenants.
    #[serde(default)]
    pub tenants: Vec<TenantEntry>,
    /// Every worker.
    #[serde(default)]
    pub workers: Vec<WorkerEntry>,
}

/// One worker's findings.
#[derive(Clone, Debug)]
pub struct Row {
    /// Worker name.
    pub name: String,
    /// Role.
    pub role: &'static str,
    /// Page size in bytes (when the model could be read).
    pub page_bytes: Option<usize>,
    /// Pool capacity in tokens.
    pub pool_tokens: Option<usize>,
    /// Context asked for (override or the model's).
    pub context: Option<usize>,
    /// Context the worker will advertise.
    pub advertised: Option<usize>,
    /// Failures; empty when the worker passes.
    pub problems: Vec<String>,
    /// Notes that are not failures.
    pub notes: Vec<String>,
}

/// Every finding of a preflight.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Per worker.
    pub rows: Vec<Row>,
    /// Cluster-wide failures (keys, page shapes, roles).
    pub cluster: Vec<String>,
}

impl Report {
    /// Whether nothing failed.
    pub fn passed(&self) -> bool {
        self.cluster.is_empty() && self.rows.iter().all(|r| r.problems.is_empty())
    }
}

fn check_worker(w: &WorkerEntry, base: &Path) -> Row {
    let mut row = Row {
        name: w.name.clone(),
        role: w.role.as_str(),
        page_bytes: None,
        pool_tokens: None,
        context: None,
        advertised: None,
        problems: Vec::new(),
        notes: Vec::new(),
    };
    let ours = env!("CARGO_PKG_VERSION");
    match &w.version {
        Some(v) if v != ours => row
            .problems
            .push(format!("version {v} differs from this launcher's {ours}")),
        Some(_) | None => {}
    }
    if w.page_size == 0 {
        row.problems
            .push("page_size must be greater than zero".into());
        return row;
    }
    let path = base.join(&w.model);
    let model = GgufFile::open(&path)
        .map_err(|e| e.to_string())
        .and_then(|f| {
            if !(2..=3).contains(&f.version()) {
                return Err(format!("GGUF version {} (supported: 2, 3)", f.version()));
            }
            LlamaConfig::from_gguf(&f).map_err(|e| e.to_string())
        });
    let cfg = match model {
        Ok(c) => c,
        Err(e) => {
            row.problems.push(format!("model {}: {e}", path.display()));
            return row;
        }
    };
    let layout = KvLayout {
        layers: cfg.layers,
        kv_heads: cfg.kv_heads,
        head_dim: cfg.head_dim,
        page_size: w.page_size,
    };
    let page_bytes = layout.page_bytes();
    row.page_bytes = Some(page_bytes);
    let context = w.context_length.unwrap_or(cfg.context_length);
    row.context = Some(context);
    let pages = match (w.pool_tokens, w.pool_bytes) {
        (Some(_), Some(_)) => {
            row.problems
                .push("give at most one of pool_tokens and pool_bytes".into());
            return row;
        }
        (Some(t), None) => layout.pages_for(t),
        (None, Some(b)) => b / page_bytes.max(1),
        (None, None) => layout.pages_for(context.saturating_mul(2)),
    };
    let pool_tokens = pages * w.page_size;
    row.pool_tokens = Some(pool_tokens);
    let input = PreflightInput {
        model_context: cfg.context_length,
        context_override: w.context_length,
        pool_tokens,
        lower_to_fit: w.lower_context_to_fit,
    };
    match preflight(input) {
        Ok(r) => {
            row.advertised = Some(r.advertised_context);
            if let Some(from) = r.lowered_from {
                row.notes.push(format!(
                    "context lowered from {from} to {} to fit the pool",
                    r.advertised_context
                ));
            }
        }
        Err(PreflightError::PoolTooSmall {
            pool_tokens,
            context,
        }) => row.problems.push(format!(
            "pool holds {pool_tokens} tokens < context {context} \
             (grow pool_tokens/pool_bytes or set lower_context_to_fit)"
        )),
        Err(e @ (PreflightError::Empty { .. } | PreflightError::OverrideTooLarge { .. })) => {
            row.problems.push(e.to_string())
        }
    }
    row
}

/// Runs every check of `file`; paths in it are relative to `base`.
pub fn check(file: &PreflightFile, base: &Path) -> anyhow::Result<Report> {
    let mut report = Report {
        rows: file.workers.iter().map(|w| check_worker(w, base)).collect(),
        cluster: Vec::new(),
    };
    let mut tenants = file.tenants.clone();
    if let Some(p) = &file.tenants_file {
        tenants.extend(TenantsFile::load(&base.join(p))?.tenants);
    }
    report.cluster.extend(problems(&tenants));
    for role in [Role::Prefill, Role::Decode] {
        if !file.workers.iter().any(|w| w.role == role) {
            report.cluster.push(format!("no {} worker", role.as_str()));
        }
    }
    let shapes: std::collections::BTreeSet<_> =
        report.rows.iter().filter_map(|r| r.page_bytes).collect();
    if shapes.len() > 1 {
        report.cluster.push(format!(
            "workers disagree on the page size in bytes ({shapes:?}): prefill and decode must \
             share model and page_size"
        ));
    }
    Ok(report)
}

fn cell(v: Option<usize>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// The report as a text table plus the cluster findings.
pub fn render(report: &Report) -> String {
    let header = [
        "worker",
        "role",
        "page bytes",
        "pool tokens",
        "context",
        "advertised",
        "result",
    ];
    let rows: Vec<[String; 7]> = report
        .rows
        .iter()
        .map(|r| {
            let result = match r.problems.first() {
                Some(_) => format!("FAIL: {}", r.problems.join("; ")),
                None if r.notes.is_empty() => "ok".to_string(),
                None => format!("ok ({})", r.notes.join("; ")),
            };
            [
                r.name.clone(),
                r.role.to_string(),
                cell(r.page_bytes),
                cell(r.pool_tokens),
                cell(r.context),
                cell(r.advertised),
                result,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in &rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    let advertised: Vec<usize> = report.rows.iter().filter_map(|r| r.advertised).collect();
    if let Some(min) = advertised.iter().min() {
        out.push_str(&format!("effective context (min over workers): {min}\n"));
    }
    for c in &report.cluster {
        out.push_str(&format!("FAIL: {c}\n"));
    }
    out.push_str(if report.passed() {
        "preflight passed\n"
    } else {
        "preflight FAILED\n"
    });
    out
}

/// Runs `pagewarden preflight`.
pub fn run(args: PreflightArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let file: PreflightFile =
        toml::from_str(&text).with_context(|| format!("parsing {}", args.config.display()))?;
    let base = args.config.parent().unwrap_or(Path::new("."));
    let report = check(&file, base)?;
    print!("{}", render(&report));
    if !report.passed() {
        let n = report.cluster.len() + report.rows.iter().map(|r| r.problems.len()).sum::<usize>();
        bail!("preflight failed: {n} problem(s), see the table above");
    }
    Ok(())
}
