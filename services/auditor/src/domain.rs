//! The auditor's vocabulary: every enum here mirrors a CHECK-constrained column of the schema
//! (`migrations/*/`), so a value the database accepts is a value Rust can name.
//!
//! Incident lifecycle (transitions are one-way; `resolved` is terminal):
//!
//! ```text
//!   open ──ack──▶ acknowledged ──resolve──▶ resolved
//!     └───────────────resolve──────────────────▲
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use pagewarden_types::integrity::IntegrityKind;
pub use pagewarden_types::UnknownValue;

/// Declares an enum whose variants map one-to-one onto SQL spellings.
macro_rules! sql_enum {
    ($(#[$m:meta])* $name:ident, $what:literal { $($(#[$vm:meta])* $var:ident => $s:literal,)+ }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vm])* $var,)+ }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var,)+];

            /// The spelling stored in the database and used in URLs and JSON.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$var => $s,)+ }
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($s => Ok($name::$var),)+
                    other => Err(UnknownValue { what: $what, value: other.to_string() }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

sql_enum!(
    /// Where an incident lies in its lifecycle.
    IncidentStatus, "incident status" {
        /// Nobody has looked at it yet.
        Open => "open",
        /// An operator has seen it and is on it.
        Acknowledged => "acknowledged",
        /// Closed, with who, when and a note.
        Resolved => "resolved",
    }
);

impl IncidentStatus {
    /// Whether an incident in `self` may move to `to`.
    pub fn can_become(self, to: IncidentStatus) -> bool {
        match (self, to) {
            (IncidentStatus::Open, IncidentStatus::Acknowledged) => true,
            (IncidentStatus::Open, IncidentStatus::Resolved) => true,
            (IncidentStatus::Acknowledged, IncidentStatus::Resolved) => true,
            (IncidentStatus::Open, IncidentStatus::Open)
            | (IncidentStatus::Acknowledged, IncidentStatus::Open)
            | (IncidentStatus::Acknowledged, IncidentStatus::Acknowledged)
            | (IncidentStatus::Resolved, IncidentStatus::Open)
            | (IncidentStatus::Resolved, IncidentStatus::Acknowledged)
            | (IncidentStatus::Resolved, IncidentStatus::Resolved) => false,
        }
    }
}

sql_enum!(
    /// Which side channel of the prefix cache the side-channel audit measured.
    IsolationChannel, "isolation channel" {
        /// First-token times: another tenant's request on a prompt one tenant had cached
        /// against a cold one (Kolmogorov–Smirnov).
        Timing => "timing",
        /// Scheduling order (PromptPeek): the order in which a mixed batch of another
        /// tenant's requests, some on a prompt one tenant had cached, gets its first tokens
        /// (an exact rank test).
        Order => "order",
    }
);

sql_enum!(
    /// How bad an incident is.
    Severity, "severity" {
        /// Expected behaviour worth a record (a deferred release that drained).
        Info => "info",
        /// Degraded but contained (quarantine, a refused late write).
        Warning => "warning",
        /// Isolation or correctness may be broken.
        Critical => "critical",
    }
);

/// What an incident is about: one of the auditor's own findings, or an integrity event a
/// worker reported ([`IntegrityKind`], wrapped, not repeated). Its spellings are the
/// `incidents.kind` column's: the integrity kinds keep their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IncidentKind {
    /// A response carried a canary marker issued to another tenant.
    CrossTenantMarker,
    /// A probe got a 5xx, a malformed 4xx, or an unexpected status.
    ProbeBadStatus,
    /// A probe's `usage.prompt_tokens` differed from the tokenizer count.
    ProbeTokenCount,
    /// A probe's first-token latency was implausible for its length.
    ProbeLatency,
    /// A probe past the context limit was answered with a 200.
    ProbeOverlengthAccepted,
    /// The router could not be reached by the prober.
    ProbeUnreachable,
    /// The side-channel audit: another tenant's first-token times on a prompt one tenant had
    /// cached are distinguishable from cold ones (a Kolmogorov–Smirnov p-value below the
    /// threshold), or the order of its mixed batch depends on that cache (an exact rank
    /// test), so the cache is visible across tenants.
    SideChannel,
    /// The recompute audit: a served token's logprob, scored again on a clean forward pass
    /// (fresh pages, no prefix cache, another process than the serving workers), differs
    /// beyond the tolerance: the answer was computed over something other than its own prompt.
    RecomputeMismatch,
    /// A worker reported an integrity event that is not routine.
    Integrity(IntegrityKind),
}

/// The auditor's own kinds, in the order [`IncidentKind::ALL`] lists them first.
const OWN_KINDS: [IncidentKind; 8] = [
    IncidentKind::CrossTenantMarker,
    IncidentKind::ProbeBadStatus,
    IncidentKind::ProbeTokenCount,
    IncidentKind::ProbeLatency,
    IncidentKind::ProbeOverlengthAccepted,
    IncidentKind::ProbeUnreachable,
    IncidentKind::SideChannel,
    IncidentKind::RecomputeMismatch,
];

const KIND_COUNT: usize = OWN_KINDS.len() + IntegrityKind::ALL.len();

const ALL_KINDS: [IncidentKind; KIND_COUNT] = {
    let mut all = [IncidentKind::CrossTenantMarker; KIND_COUNT];
    let mut i = 0;
    while i < OWN_KINDS.len() {
        all[i] = OWN_KINDS[i];
        i += 1;
    }
    let mut j = 0;
    while j < IntegrityKind::ALL.len() {
        all[i + j] = IncidentKind::Integrity(IntegrityKind::ALL[j]);
        j += 1;
    }
    all
};

impl From<IntegrityKind> for IncidentKind {
    fn from(k: IntegrityKind) -> Self {
        IncidentKind::Integrity(k)
    }
}

impl FromStr for IncidentKind {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IncidentKind::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownValue {
                what: "incident kind",
                value: s.to_string(),
            })
    }
}

impl fmt::Display for IncidentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for IncidentKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for IncidentKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl IncidentKind {
    /// Every kind: the auditor's own, then every integrity kind.
    pub const ALL: &'static [IncidentKind] = &ALL_KINDS;

    /// The spelling stored in the database and used in URLs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentKind::CrossTenantMarker => "cross_tenant_marker",
            IncidentKind::ProbeBadStatus => "probe_bad_status",
            IncidentKind::ProbeTokenCount => "probe_token_count",
            IncidentKind::ProbeLatency => "probe_latency",
            IncidentKind::ProbeOverlengthAccepted => "probe_overlength_accepted",
            IncidentKind::ProbeUnreachable => "probe_unreachable",
            IncidentKind::SideChannel => "side_channel",
            IncidentKind::RecomputeMismatch => "recompute_mismatch",
            IncidentKind::Integrity(k) => k.as_str(),
        }
    }

    /// The severity an incident of this kind opens with.
    pub fn severity(self) -> Severity {
        match self {
            IncidentKind::CrossTenantMarker
            | IncidentKind::ProbeTokenCount
            | IncidentKind::ProbeOverlengthAccepted
            | IncidentKind::SideChannel
            | IncidentKind::RecomputeMismatch => Severity::Critical,
            IncidentKind::ProbeBadStatus
            | IncidentKind::ProbeLatency
            | IncidentKind::ProbeUnreachable => Severity::Warning,
            IncidentKind::Integrity(k) => match k {
                IntegrityKind::GenerationMismatch
                | IntegrityKind::ChecksumMismatch
                | IntegrityKind::CountMismatch
                | IntegrityKind::GuardWordCorrupt
                | IntegrityKind::PreflightFailed
                | IntegrityKind::PageNotWritten
                | IntegrityKind::ManifestMismatch => Severity::Critical,
                IntegrityKind::WriteRejected
                | IntegrityKind::Quarantine
                | IntegrityKind::DeferredReleaseTimedOut
                | IntegrityKind::StaleMessage => Severity::Warning,
                IntegrityKind::DeferredReleaseDrained => Severity::Info,
            },
        }
    }
}

sql_enum!(
    /// What a recompute audit found.
    RecomputeVerdict, "recompute verdict" {
        /// Every served logprob is within the tolerance of the clean one.
        Match => "match",
        /// At least one is not: an incident was opened.
        Mismatch => "mismatch",
        /// The clean pass could not run (e.g. the tokens do not fit the model).
        Failed => "failed",
    }
);

sql_enum!(
    /// How a sampled request ended, as the router saw it.
    SampleStatus, "sample status" {
        /// A response was produced.
        Ok => "ok",
        /// Refused at admission.
        Rejected => "rejected",
        /// Failed after admission.
        Error => "error",
        /// The client went away.
        Cancelled => "cancelled",
    }
);

sql_enum!(
    /// A prefix-cache event a worker reported (I10).
    CacheEventKind, "cache event kind" {
        /// A prompt found part of itself cached in its namespace.
        Hit => "hit",
        /// A prompt found nothing cached.
        Miss => "miss",
        /// Cached pages of a namespace were given up.
        Eviction => "eviction",
        /// How many cached pages a namespace holds on a worker now: a state, kept per worker
        /// and namespace (`cache_held`), not an event row.
        Held => "held",
    }
);

sql_enum!(
    /// A worker's role in the PD split.
    NodeRole, "node role" {
        /// Runs prompt forward passes and writes KV pages.
        Prefill => "prefill",
        /// Owns the KV pool and generates tokens.
        Decode => "decode",
    }
);

sql_enum!(
    /// Where a probe run stands.
    ProbeRunStatus, "probe run status" {
        /// Steps are still being sent.
        Running => "running",
        /// Every step was clean.
        Passed => "passed",
        /// At least one step failed a check.
        Failed => "failed",
        /// The run could not be carried out (router unreachable, no limit advertised).
        Error => "error",
    }
);

sql_enum!(
    /// Which steps a probe run sends.
    SweepKind, "sweep kind" {
        /// Per tenant, one short prompt and one just past the context limit: cheap enough to
        /// run every few minutes on a CPU.
        Light => "light",
        /// Per tenant, lengths from one page doubling up to the limit, then past it.
        Full => "full",
    }
);

sql_enum!(
    /// What one probe step observed.
    ProbeOutcome, "probe outcome" {
        /// A 200 that passed every check.
        Accepted => "accepted",
        /// A clean 4xx in OpenAI's error shape.
        RejectedClean => "rejected_clean",
        /// 5xx, malformed error body, or a 4xx with the wrong code.
        BadStatus => "bad_status",
        /// `usage.prompt_tokens` differed from the tokenizer count.
        TokenMismatch => "token_mismatch",
        /// First-token latency outside the plausible band.
        LatencyImplausible => "latency_implausible",
        /// A prompt past the context limit was answered with a 200.
        OverlengthAccepted => "overlength_accepted",
        /// The response carried another tenant's marker.
        Leak => "leak",
        /// No HTTP answer at all.
        TransportError => "transport_error",
    }
);

impl ProbeOutcome {
    /// The incident this outcome opens, if any.
    pub fn incident_kind(self) -> Option<IncidentKind> {
        match self {
            ProbeOutcome::Accepted | ProbeOutcome::RejectedClean => None,
            ProbeOutcome::BadStatus => Some(IncidentKind::ProbeBadStatus),
            ProbeOutcome::TokenMismatch => Some(IncidentKind::ProbeTokenCount),
            ProbeOutcome::LatencyImplausible => Some(IncidentKind::ProbeLatency),
            ProbeOutcome::OverlengthAccepted => Some(IncidentKind::ProbeOverlengthAccepted),
            ProbeOutcome::Leak => Some(IncidentKind::CrossTenantMarker),
            ProbeOutcome::TransportError => Some(IncidentKind::ProbeUnreachable),
        }
    }
}

/// Row id of an incident.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct IncidentId(pub i64);

impl fmt::Display for IncidentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Row id of a probe run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProbeRunId(pub i64);

/// Milliseconds since the Unix epoch: the one time unit of the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UnixMs(pub i64);

impl UnixMs {
    /// The current wall-clock time.
    pub fn now() -> Self {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        UnixMs(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for k in IncidentKind::ALL {
            assert_eq!(k.as_str().parse::<IncidentKind>().unwrap(), *k);
        }
        for k in IntegrityKind::ALL {
            let as_incident = IncidentKind::from(*k);
            assert_eq!(as_incident.as_str(), k.as_str());
            assert!(IncidentKind::ALL.contains(&as_incident));
        }
        let json = serde_json::to_string(&IncidentKind::Integrity(IntegrityKind::CountMismatch));
        assert_eq!(json.unwrap(), "\"count_mismatch\"");
        let back: IncidentKind = serde_json::from_str("\"probe_latency\"").unwrap();
        assert_eq!(back, IncidentKind::ProbeLatency);
        assert!(serde_json::from_str::<IncidentKind>("\"bogus\"").is_err());
        assert!("bogus".parse::<IncidentStatus>().is_err());
    }

    #[test]
    fn resolved_is_terminal() {
        for to in IncidentStatus::ALL {
            assert!(!IncidentStatus::Resolved.can_become(*to));
        }
        assert!(IncidentStatus::Open.can_become(IncidentStatus::Acknowledged));
        assert!(!IncidentStatus::Acknowledged.can_become(IncidentStatus::Open));
    }
}
