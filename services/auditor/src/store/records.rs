//! Row types: what the store writes (`New*`) and what it reads back.

use serde::Serialize;

use crate::domain::{
    CacheEventKind, IncidentId, IncidentKind, IncidentStatus, IntegrityKind, NodeRole,
    ProbeOutcome, ProbeRunId, ProbeRunStatus, SampleStatus, Severity, SweepKind, UnixMs,
};

/// An incident to open.
#[derive(Clone, Debug)]
pub struct NewIncident {
    /// What it is about.
    pub kind: IncidentKind,
    /// How bad it is.
    pub severity: Severity,
    /// The worker involved, if any.
    pub node: Option<String>,
    /// The request involved, hex, if any.
    pub request_id: Option<String>,
    /// The tenant affected (the reader, for a leak).
    pub tenant: Option<String>,
    /// The other tenant involved (the owner of a leaked marker).
    pub other_tenant: Option<String>,
    /// The KV page involved, on `node`, if any.
    pub page: Option<i64>,
    /// The page's generation involved, if any.
    pub generation: Option<i64>,
    /// JSON text with whatever the detector knew.
    pub details: String,
    /// When it was detected.
    pub at: UnixMs,
}

/// Who moved an incident along, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Signoff {
    /// Operator name.
    pub by: String,
    /// When.
    pub at: UnixMs,
    /// Free-form note.
    pub note: String,
}

/// A stored incident.
#[derive(Clone, Debug, Serialize)]
pub struct Incident {
    /// Row id.
    pub id: IncidentId,
    /// What it is about.
    pub kind: IncidentKind,
    /// How bad it is.
    pub severity: Severity,
    /// Where it is in its lifecycle.
    pub status: IncidentStatus,
    /// The worker involved, if any.
    pub node: Option<String>,
    /// The request involved, hex, if any.
    pub request_id: Option<String>,
    /// The tenant affected.
    pub tenant: Option<String>,
    /// The other tenant involved.
    pub other_tenant: Option<String>,
    /// The KV page involved, on `node`, if any.
    pub page: Option<i64>,
    /// The page's generation involved, if any.
    pub generation: Option<i64>,
    /// JSON text with whatever the detector knew.
    pub details: String,
    /// When it was detected.
    pub created_at: UnixMs,
    /// Set once acknowledged.
    pub acknowledged: Option<Signoff>,
    /// Set once resolved.
    pub resolved: Option<Signoff>,
}

/// Which incidents to list; `None` fields do not filter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IncidentFilter {
    /// Only this status.
    pub status: Option<IncidentStatus>,
    /// Only this kind.
    pub kind: Option<IncidentKind>,
    /// Only incidents naming this tenant (as reader or as other tenant).
    pub tenant: Option<String>,
    /// Only incidents on this node.
    pub node: Option<String>,
    /// Only incidents tagged with this KV page (on any node unless `node` is set too).
    pub page: Option<i64>,
    /// Only incidents tagged with this page generation.
    pub generation: Option<i64>,
}

/// Which slice of a newest-first list to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// At most this many rows.
    pub limit: i64,
    /// After skipping this many.
    pub offset: i64,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            limit: 100,
            offset: 0,
        }
    }
}

/// A sampled response to record.
#[derive(Clone, Debug)]
pub struct NewSample {
    /// The tenant who made the request.
    pub tenant: String,
    /// The request, hex.
    pub request_id: Option<String>,
    /// The decode node, when known.
    pub node: Option<String>,
    /// Prompt length in tokens.
    pub prompt_tokens: i64,
    /// Completion length in tokens.
    pub completion_tokens: i64,
    /// Hex digest of the response text.
    pub response_digest: String,
    /// Whether the text was available and scanned.
    pub scanned: bool,
    /// Markers of other tenants found in it.
    pub foreign_markers: i64,
    /// Time to first token.
    pub ttft_ms: Option<i64>,
    /// How it ended.
    pub status: SampleStatus,
    /// When it was received.
    pub at: UnixMs,
}

/// An integrity event to record.
#[derive(Clone, Debug, Serialize)]
pub struct NewIntegrityEvent {
    /// What was detected.
    pub kind: IntegrityKind,
    /// The reporting worker.
    pub node: String,
    /// The request involved, hex.
    pub request_id: Option<String>,
    /// The tenant involved.
    pub tenant: Option<String>,
    /// The page involved.
    pub page: Option<i64>,
    /// The generation presented or expected.
    pub generation: Option<i64>,
    /// Free-form details.
    pub details: String,
    /// Routine (counted, no incident): see [`IntegrityKind::is_routine`].
    pub routine: bool,
    /// When it was received.
    pub at: UnixMs,
}

/// How many routine integrity events of one kind were counted, and the latest.
#[derive(Clone, Debug, Serialize)]
pub struct RoutineCount {
    /// Event kind.
    pub kind: IntegrityKind,
    /// Events counted.
    pub count: i64,
    /// When the latest arrived.
    pub last_at: UnixMs,
}

/// A prefix-cache event to record.
#[derive(Clone, Debug)]
pub struct NewCacheEvent {
    /// Hit, miss or eviction.
    pub kind: CacheEventKind,
    /// The worker's node id.
    pub node: String,
    /// Prefill or decode.
    pub role: NodeRole,
    /// Hit, miss: whose prompt it was; eviction: whose request last used the namespace.
    pub tenant: Option<String>,
    /// The namespace's tag.
    pub namespace: String,
    /// The request, hex.
    pub request_id: Option<String>,
    /// Prompt tokens looked up.
    pub prompt_tokens: i64,
    /// Of those, found cached.
    pub cached_tokens: i64,
    /// Pages hit or evicted.
    pub pages: i64,
    /// When it was received.
    pub at: UnixMs,
}

/// A tenant's prefix-cache events on one role, for the cache summary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CacheTotals {
    /// Prefill or decode.
    pub role: NodeRole,
    /// Empty for evictions whose last user was unknown.
    pub tenant: String,
    /// Lookups that found a cached prefix.
    pub hits: i64,
    /// Lookups that found none.
    pub misses: i64,
    /// Namespaces evicted.
    pub evictions: i64,
    /// Prompt tokens looked up.
    pub prompt_tokens: i64,
    /// Of those, found cached.
    pub cached_tokens: i64,
    /// Pages evicted.
    pub evicted_pages: i64,
    /// Namespace tags it was seen in.
    pub namespaces: i64,
    /// Cached pages its namespaces hold now, as the workers last said.
    pub pages_held: i64,
}

/// How many cached pages a namespace holds on a worker, as the worker last said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CacheHeld {
    /// The worker.
    pub node: String,
    /// Its role.
    pub role: NodeRole,
    /// The namespace's tag.
    pub namespace: String,
    /// Who last used it there, if known.
    pub tenant: Option<String>,
    /// Pages held.
    pub pages: i64,
    /// When it was said.
    pub at: UnixMs,
}

/// A preflight report to record.
#[derive(Clone, Debug, Serialize)]
pub struct NewPreflight {
    /// The worker.
    pub node: String,
    /// Its role.
    pub role: NodeRole,
    /// KV pool capacity in tokens.
    pub pool_tokens: i64,
    /// Advertised context length.
    pub context_length: i64,
    /// Whether the worker judged itself fit to serve.
    pub ok: bool,
    /// Its explanation.
    pub message: String,
    /// When it was received.
    pub at: UnixMs,
}

/// A node's most recent preflight, for the node table.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    /// The latest report.
    #[serde(flatten)]
    pub last: NewPreflight,
    /// How many reports this node has sent.
    pub reports: i64,
}

/// One issued canary marker.
#[derive(Clone, Debug, Serialize)]
pub struct MarkerRecord {
    /// The marker text.
    pub marker: String,
    /// Its tenant.
    pub tenant: String,
    /// When it was issued.
    pub issued_at: UnixMs,
}

/// Integrity events of one kind in one time bucket.
#[derive(Clone, Debug, Serialize)]
pub struct SeriesPoint {
    /// Bucket start.
    pub bucket: UnixMs,
    /// Event kind.
    pub kind: IntegrityKind,
    /// Events in the bucket.
    pub count: i64,
}

/// Incidents of one severity opened in one time bucket.
#[derive(Clone, Debug, Serialize)]
pub struct IncidentPoint {
    /// Bucket start.
    pub bucket: UnixMs,
    /// Severity.
    pub severity: Severity,
    /// Incidents opened in the bucket.
    pub count: i64,
}

/// A sampled request as the latency chart draws it.
#[derive(Clone, Debug, Serialize)]
pub struct SamplePoint {
    /// The tenant who made the request.
    pub tenant: String,
    /// Prompt length in tokens.
    pub prompt_tokens: i64,
    /// Time to first token, when there was one.
    pub ttft_ms: Option<i64>,
    /// How it ended.
    pub status: SampleStatus,
    /// When it was received.
    pub at: UnixMs,
}

/// Totals over the samples table.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SampleTotals {
    /// Samples recorded.
    pub samples: i64,
    /// Samples whose text was scanned.
    pub scanned: i64,
    /// Samples carrying another tenant's marker.
    pub with_foreign_markers: i64,
}

/// A stored probe run.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeRun {
    /// Row id.
    pub id: ProbeRunId,
    /// Start time.
    pub started_at: UnixMs,
    /// End time, once finished.
    pub finished_at: Option<UnixMs>,
    /// Where it stands.
    pub status: ProbeRunStatus,
    /// Which steps it sends.
    pub sweep: SweepKind,
    /// The context limit the router advertised.
    pub context_limit: Option<i64>,
    /// Steps sent.
    pub steps: i64,
    /// Steps that failed a check.
    pub failures: i64,
    /// Summary.
    pub message: String,
}

/// How a probe run ended, to store.
#[derive(Clone, Debug)]
pub struct ProbeRunEnd {
    /// Final status (not `Running`).
    pub status: ProbeRunStatus,
    /// The context limit the router advertised.
    pub context_limit: Option<i64>,
    /// Steps sent.
    pub steps: i64,
    /// Steps that failed a check.
    pub failures: i64,
    /// Summary.
    pub message: String,
    /// End time.
    pub at: UnixMs,
}

/// One probe step's observation.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeResult {
    /// The probe tenant that sent it.
    pub tenant: String,
    /// Step number within the run, from 0.
    pub step: i64,
    /// Filler words in the prompt (the length knob).
    pub prompt_words: i64,
    /// Tokenizer count of the prompt, when a tokenizer is configured.
    pub expected_tokens: Option<i64>,
    /// What was observed.
    pub outcome: ProbeOutcome,
    /// HTTP status, when an answer came.
    pub http_status: Option<i64>,
    /// `usage.prompt_tokens` of a 200.
    pub prompt_tokens: Option<i64>,
    /// First-token latency of a 200.
    pub ttft_ms: Option<i64>,
    /// What was wrong, or the error code of a clean 4xx.
    pub detail: String,
    /// When it was observed.
    pub at: UnixMs,
}
