//! The auditor's own counters, rendered as Prometheus text under the `pagewarden_` prefix.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::domain::{CacheEventKind, IncidentKind, IntegrityKind, NodeRole};

/// A prefix-cache counter's labels: role, kind, tenant.
type CacheKey = (NodeRole, CacheEventKind, String);

/// Monotonic counters; gauges that live in the database are rendered by the caller.
pub struct Metrics {
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
    /// The side-channel audit's last p-values per worker: (other tenant vs cold, warm vs cold).
    isolation: Mutex<BTreeMap<String, (f64, f64)>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
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
        m.insert(worker.to_string(), (cross, control));
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
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (worker, ps) in isolation.iter() {
                let p = if pick == 0 { ps.0 } else { ps.1 };
                let _ = writeln!(out, "{name}{{worker=\"{}\"}} {p}", label(worker));
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
