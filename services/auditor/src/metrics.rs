//! The auditor's own counters, rendered as Prometheus text under the `pagewarden_` prefix.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::domain::{CacheEventKind, IncidentKind, IntegrityKind, NodeRole, RecomputeVerdict};

/// A prefix-cache counter's labels: role, kind, tenant.
type CacheKey = (NodeRole, CacheEventKind, String);

/// Upper bounds (nats) of the recompute audit's difference histogram's buckets.
const DIFF_BUCKETS: [f64; 10] = [0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.5, 1.0];

/// Every recompute verdict, in the order their counters are kept.
const VERDICTS: [RecomputeVerdict; 3] = [
    RecomputeVerdict::Match,
    RecomputeVerdict::Mismatch,
    RecomputeVerdict::Failed,
];

/// Monotonic counters; gauges that live in the database are rendered by the caller.
pub struct Metrics {
    /// Recomputes by verdict ([`VERDICTS`] order).
    recomputes: [AtomicU64; 3],
    /// Recompute reports dropped: the queue was full, or no recompute model is configured.
    recompute_dropped: AtomicU64,
    /// Scored recomputes' largest |served − clean| logprob: per bucket of [`DIFF_BUCKETS`]
    /// (then +Inf), and their sum in millionths of a nat.
    recompute_diff: [AtomicU64; DIFF_BUCKETS.len() + 1],
    recompute_diff_micro_sum: AtomicU64,
    samples: AtomicU64,
    samples_unscanned: AtomicU64,
    preflight_reports: AtomicU64,
    probe_runs: AtomicU64,
    probe_failures: AtomicU64,
    ingest_errors: AtomicU64,
    integrity: Vec<AtomicU64>,
    routine: Vec<AtomicU64>,
    incidents: Vec<AtomicU64>,
    /// Prefix-cache events and the tokens their hits reused, per (role, kind, tenant).
    cache: Mutex<BTreeMap<CacheKey, (u64, u64)>>,
    /// The side-channel audit's last p-values per worker.
    isolation: Mutex<BTreeMap<String, IsolationGauges>>,
}

/// The side-channel audit's last p-values of one worker (each set once measured).
#[derive(Clone, Copy, Debug, Default)]
struct IsolationGauges {
    /// Another tenant's first-token times on a cached prompt against cold ones.
    ks: Option<f64>,
    /// The owner's warm times against cold ones (the positive control).
    control: Option<f64>,
    /// The scheduling order of another tenant's mixed batch.
    order: Option<f64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            recomputes: Default::default(),
            recompute_dropped: AtomicU64::new(0),
            recompute_diff: Default::default(),
            recompute_diff_micro_sum: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            samples_unscanned: AtomicU64::new(0),
            preflight_reports: AtomicU64::new(0),
            probe_runs: AtomicU64::new(0),
            probe_failures: AtomicU64::new(0),
            ingest_errors: AtomicU64::new(0),
            integrity: IntegrityKind::ALL
                .iter()
                .map(|_| AtomicU64::new(0))
                .collect(),
            routine: IntegrityKind::ALL
                .iter()
                .map(|_| AtomicU64::new(0))
                .collect(),
            incidents: IncidentKind::ALL
                .iter()
                .map(|_| AtomicU64::new(0))
                .collect(),
            cache: Mutex::new(BTreeMap::new()),
            isolation: Mutex::new(BTreeMap::new()),
        }
    }
}

/// `s` as a Prometheus label value.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn index_of<T: PartialEq>(all: &[T], v: &T) -> usize {
    all.iter().position(|x| x == v).unwrap_or(0)
}

impl Metrics {
    /// A sample was ingested; `scanned` says whether its text was available.
    pub fn sample(&self, scanned: bool) {
        bump(&self.samples);
        if !scanned {
            bump(&self.samples_unscanned);
        }
    }

    /// An integrity event was ingested.
    pub fn integrity(&self, kind: IntegrityKind) {
        bump(&self.integrity[index_of(IntegrityKind::ALL, &kind)]);
    }

    /// A routine integrity event was counted instead of opening an incident.
    pub fn routine(&self, kind: IntegrityKind) {
        bump(&self.routine[index_of(IntegrityKind::ALL, &kind)]);
    }

    /// An incident was opened.
    pub fn incident(&self, kind: IncidentKind) {
        bump(&self.incidents[index_of(IncidentKind::ALL, &kind)]);
    }

    /// A prefix-cache event was ingested (`cached_tokens` reused, for a hit).
    pub fn cache_event(
        &self,
        role: NodeRole,
        kind: CacheEventKind,
        tenant: &str,
        cached_tokens: u64,
    ) {
        let mut m = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.entry((role, kind, tenant.to_string())).or_default();
        e.0 += 1;
        e.1 += cached_tokens;
    }

    /// The side-channel audit measured `worker`: the Kolmogorov–Smirnov p-value of another
    /// tenant's first-token times on a cached prompt against cold ones (`cross`), and of the
    /// owner's own warm times against cold ones (`control`, the positive control).
    pub fn isolation(&self, worker: &str, cross: f64, control: f64) {
        let mut m = self.isolation.lock().unwrap_or_else(|p| p.into_inner());
        let g = m.entry(worker.to_string()).or_default();
        g.ks = Some(cross);
        g.control = Some(control);
    }

    /// The side-channel audit's scheduling-order check measured `worker`: the exact p-value
    /// of another tenant's mixed batch coming back in an order that favours the requests on
    /// a prompt one tenant had cached.
    pub fn isolation_order(&self, worker: &str, p: f64) {
        let mut m = self.isolation.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(worker.to_string()).or_default().order = Some(p);
    }

    /// A recompute ended with `verdict`; a scored one's largest logprob difference was
    /// `max_diff` nats.
    pub fn recompute(&self, verdict: RecomputeVerdict, max_diff: f32) {
        bump(&self.recomputes[index_of(&VERDICTS, &verdict)]);
        if verdict == RecomputeVerdict::Failed {
            return;
        }
        let d = f64::from(max_diff);
        let bucket = DIFF_BUCKETS
            .iter()
            .position(|&b| d <= b)
            .unwrap_or(DIFF_BUCKETS.len());
        bump(&self.recompute_diff[bucket]);
        let micro = if d.is_finite() {
            (d * 1e6) as u64
        } else {
            u64::MAX / 1024
        };
        self.recompute_diff_micro_sum
            .fetch_add(micro, Ordering::Relaxed);
    }

    /// A recompute report was not queued (queue full, or no recompute model).
    pub fn recompute_dropped(&self) {
        bump(&self.recompute_dropped);
    }

    /// A preflight report was ingested.
    pub fn preflight(&self) {
        bump(&self.preflight_reports);
    }

    /// A probe run finished with `failures` failed steps.
    pub fn probe_run(&self, failures: u64) {
        bump(&self.probe_runs);
        self.probe_failures.fetch_add(failures, Ordering::Relaxed);
    }

    /// Storing an ingested report failed.
    pub fn ingest_error(&self) {
        bump(&self.ingest_errors);
    }

    /// Incidents opened so far, of every kind.
    pub fn incidents_total(&self) -> u64 {
        self.incidents
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Prometheus text exposition of every counter.
    pub fn render(&self, out: &mut String) {
        let simple: [(&str, &str, &AtomicU64); 6] = [
            (
                "pagewarden_auditor_samples_total",
                "Sampled responses ingested",
                &self.samples,
            ),
            (
                "pagewarden_auditor_samples_unscanned_total",
                "Samples that carried only a digest",
                &self.samples_unscanned,
            ),
            (
                "pagewarden_auditor_preflight_reports_total",
                "Preflight reports ingested",
                &self.preflight_reports,
            ),
            (
                "pagewarden_auditor_probe_runs_total",
                "Probe runs finished",
                &self.probe_runs,
            ),
            (
                "pagewarden_auditor_probe_failures_total",
                "Probe steps that failed a check",
                &self.probe_failures,
            ),
            (
                "pagewarden_auditor_ingest_errors_total",
                "Reports that could not be stored",
                &self.ingest_errors,
            ),
        ];
        for (name, help, c) in simple {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", c.load(Ordering::Relaxed));
        }
        let name = "pagewarden_auditor_recomputes_total";
        let _ = writeln!(
            out,
            "# HELP {name} Recompute audits by verdict\n# TYPE {name} counter"
        );
        for (v, c) in VERDICTS.iter().zip(&self.recomputes) {
            let _ = writeln!(
                out,
                "{name}{{verdict=\"{v}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let name = "pagewarden_auditor_recompute_dropped_total";
        let _ = writeln!(
            out,
            "# HELP {name} Recompute reports not queued (queue full, or no recompute model)\n\
             # TYPE {name} counter\n{name} {}",
            self.recompute_dropped.load(Ordering::Relaxed)
        );
        let name = "pagewarden_auditor_recompute_max_diff_nats";
        let _ = writeln!(
            out,
            "# HELP {name} Each scored recompute's largest difference between a served and a \
             clean logprob\n# TYPE {name} histogram"
        );
        let mut cumulative = 0;
        for (i, c) in self.recompute_diff.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            match DIFF_BUCKETS.get(i) {
                Some(b) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let sum = self.recompute_diff_micro_sum.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
        let name = "pagewarden_auditor_integrity_events_total";
        let _ = writeln!(
            out,
            "# HELP {name} Integrity events ingested\n# TYPE {name} counter"
        );
        for (k, c) in IntegrityKind::ALL.iter().zip(&self.integrity) {
            let _ = writeln!(out, "{name}{{kind=\"{k}\"}} {}", c.load(Ordering::Relaxed));
        }
        let name = "pagewarden_auditor_routine_events_total";
        let _ = writeln!(
            out,
            "# HELP {name} Routine integrity events counted instead of opening an incident\n\
             # TYPE {name} counter"
        );
        for (k, c) in IntegrityKind::ALL.iter().zip(&self.routine) {
            let _ = writeln!(out, "{name}{{kind=\"{k}\"}} {}", c.load(Ordering::Relaxed));
        }
        let name = "pagewarden_auditor_incidents_opened_total";
        let _ = writeln!(out, "# HELP {name} Incidents opened\n# TYPE {name} counter");
        for (k, c) in IncidentKind::ALL.iter().zip(&self.incidents) {
            let _ = writeln!(out, "{name}{{kind=\"{k}\"}} {}", c.load(Ordering::Relaxed));
        }
        let isolation = self.isolation.lock().unwrap_or_else(|p| p.into_inner());
        for (name, help, pick) in [
            (
                "pagewarden_auditor_isolation_ks_p",
                "Side-channel audit: Kolmogorov-Smirnov p-value of another tenant's first-token \
                 times on a cached prompt against cold ones (low: the cache is visible across \
                 tenants)",
                0,
            ),
            (
                "pagewarden_auditor_isolation_control_ks_p",
                "Side-channel audit's positive control: p-value of the owner's warm first-token \
                 times against cold ones (low: the audit can see a cache hit)",
                1,
            ),
            (
                "pagewarden_auditor_isolation_order_p",
                "Side-channel audit, scheduling order: exact p-value of another tenant's mixed \
                 batch coming back with its requests on a cached prompt first (low: the order \
                 depends on another tenant's cache)",
                2,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (worker, g) in isolation.iter() {
                let p = [g.ks, g.control, g.order][pick];
                if let Some(p) = p {
                    let _ = writeln!(out, "{name}{{worker=\"{}\"}} {p}", label(worker));
                }
            }
        }
        drop(isolation);
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let (events, tokens) = (
            "pagewarden_auditor_prefix_cache_events_total",
            "pagewarden_auditor_prefix_cache_hit_tokens_total",
        );
        let _ = writeln!(
            out,
            "# HELP {events} Prefix-cache hits, misses and evictions the workers reported\n\
             # TYPE {events} counter"
        );
        for ((role, kind, tenant), (n, _)) in cache.iter() {
            let t = label(tenant);
            let _ = writeln!(
                out,
                "{events}{{role=\"{role}\",kind=\"{kind}\",tenant=\"{t}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP {tokens} Prompt tokens the workers' prefix-cache hits reused\n\
             # TYPE {tokens} counter"
        );
        for ((role, kind, tenant), (_, reused)) in cache.iter() {
            if *kind == CacheEventKind::Hit {
                let t = label(tenant);
                let _ = writeln!(out, "{tokens}{{role=\"{role}\",tenant=\"{t}\"}} {reused}");
            }
        }
    }
}
