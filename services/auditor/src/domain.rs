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

/// A column value that is not one of the enum's spellings.
#[derive(Debug, thiserror::Error)]
#[error("unknown {what} value {value:?}")]
pub struct UnknownValue {
    /// Which enum was being parsed.
    pub what: &'static str,
    /// The rejected text.
    pub value: String,
}

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

sql_enum!(
    /// Integrity events reported by prefill and decode workers.
    IntegrityKind, "integrity kind" {
        /// A read presented a stale (page, generation).
        GenerationMismatch => "generation_mismatch",
        /// A page's checksum did not match the manifest.
        ChecksumMismatch => "checksum_mismatch",
        /// Tokens written differed from tokens reserved.
        CountMismatch => "count_mismatch",
        /// A guard word was overwritten.
        GuardWordCorrupt => "guard_word_corrupt",
        /// A write carried a revoked or unknown grant key.
        WriteRejected => "write_rejected",
        /// Pages were quarantined because their drain could not be confirmed.
        Quarantine => "quarantine",
        /// A deferred release was confirmed drained.
        DeferredReleaseDrained => "deferred_release_drained",
        /// A deferred release gave up waiting.
        DeferredReleaseTimedOut => "deferred_release_timed_out",
        /// A worker's pool could not hold its advertised context.
        PreflightFailed => "preflight_failed",
        /// A granted page was never written.
        PageNotWritten => "page_not_written",
        /// The commit manifest's digest or grant key did not match.
        ManifestMismatch => "manifest_mismatch",
        /// A stale message (old attempt, revoked grant) was dropped and counted (I5).
        StaleMessage => "stale_message",
    }
);

sql_enum!(
    /// What an incident is about.
    IncidentKind, "incident kind" {
        /// A response carried a canary marker issued to another tenant.
        CrossTenantMarker => "cross_tenant_marker",
        /// A probe got a 5xx, a malformed 4xx, or an unexpected status.
        ProbeBadStatus => "probe_bad_status",
        /// A probe's `usage.prompt_tokens` differed from the tokenizer count.
        ProbeTokenCount => "probe_token_count",
        /// A probe's first-token latency was implausible for its length.
        ProbeLatency => "probe_latency",
        /// A probe past the context limit was answered with a 200.
        ProbeOverlengthAccepted => "probe_overlength_accepted",
        /// The router could not be reached by the prober.
        ProbeUnreachable => "probe_unreachable",
        /// See [`IntegrityKind::GenerationMismatch`].
        GenerationMismatch => "generation_mismatch",
        /// See [`IntegrityKind::ChecksumMismatch`].
        ChecksumMismatch => "checksum_mismatch",
        /// See [`IntegrityKind::CountMismatch`].
        CountMismatch => "count_mismatch",
        /// See [`IntegrityKind::GuardWordCorrupt`].
        GuardWordCorrupt => "guard_word_corrupt",
        /// See [`IntegrityKind::WriteRejected`].
        WriteRejected => "write_rejected",
        /// See [`IntegrityKind::Quarantine`].
        Quarantine => "quarantine",
        /// See [`IntegrityKind::DeferredReleaseDrained`].
        DeferredReleaseDrained => "deferred_release_drained",
        /// See [`IntegrityKind::DeferredReleaseTimedOut`].
        DeferredReleaseTimedOut => "deferred_release_timed_out",
        /// A node's preflight failed, or reported a pool smaller than its context.
        PreflightFailed => "preflight_failed",
        /// See [`IntegrityKind::PageNotWritten`].
        PageNotWritten => "page_not_written",
        /// See [`IntegrityKind::ManifestMismatch`].
        ManifestMismatch => "manifest_mismatch",
        /// See [`IntegrityKind::StaleMessage`].
        StaleMessage => "stale_message",
    }
);

impl From<IntegrityKind> for IncidentKind {
    fn from(k: IntegrityKind) -> Self {
        match k {
            IntegrityKind::GenerationMismatch => IncidentKind::GenerationMismatch,
            IntegrityKind::ChecksumMismatch => IncidentKind::ChecksumMismatch,
            IntegrityKind::CountMismatch => IncidentKind::CountMismatch,
            IntegrityKind::GuardWordCorrupt => IncidentKind::GuardWordCorrupt,
            IntegrityKind::WriteRejected => IncidentKind::WriteRejected,
            IntegrityKind::Quarantine => IncidentKind::Quarantine,
            IntegrityKind::DeferredReleaseDrained => IncidentKind::DeferredReleaseDrained,
            IntegrityKind::DeferredReleaseTimedOut => IncidentKind::DeferredReleaseTimedOut,
            IntegrityKind::PreflightFailed => IncidentKind::PreflightFailed,
            IntegrityKind::PageNotWritten => IncidentKind::PageNotWritten,
            IntegrityKind::ManifestMismatch => IncidentKind::ManifestMismatch,
            IntegrityKind::StaleMessage => IncidentKind::StaleMessage,
        }
    }
}

impl IntegrityKind {
    /// Whether an event of this kind is routine: the defense did its job and no tenant's data
    /// went anywhere, so the event is stored and counted (dashboard, metrics) but opens no
    /// incident. `names_request` says whether the event names the request it concerns.
    ///
    /// Routine:
    /// - `deferred_release_drained`: pages went back to the free list only once no write could
    ///   still land (I4 working as designed).
    /// - `stale_message` naming a request: a late message of an old attempt, a reused request
    ///   id or a revoked grant, dropped and counted (I5 working as designed; cancellations and
    ///   retries produce them all day).
    ///
    /// Everything else opens an incident, and so does a `stale_message` that names no request:
    /// a message no request accounts for (a KV transfer connection refused for its certificate
    /// or a forged frame) is evidence of something outside the protocol.
    pub fn is_routine(self, names_request: bool) -> bool {
        match self {
            IntegrityKind::DeferredReleaseDrained => true,
            IntegrityKind::StaleMessage => names_request,
            IntegrityKind::GenerationMismatch
            | IntegrityKind::ChecksumMismatch
            | IntegrityKind::CountMismatch
            | IntegrityKind::GuardWordCorrupt
            | IntegrityKind::WriteRejected
            | IntegrityKind::Quarantine
            | IntegrityKind::DeferredReleaseTimedOut
            | IntegrityKind::PreflightFailed
            | IntegrityKind::PageNotWritten
            | IntegrityKind::ManifestMismatch => false,
        }
    }
}

impl IncidentKind {
    /// The severity an incident of this kind opens with.
    pub fn severity(self) -> Severity {
        match self {
            IncidentKind::CrossTenantMarker
            | IncidentKind::ProbeTokenCount
            | IncidentKind::ProbeOverlengthAccepted
            | IncidentKind::GenerationMismatch
            | IncidentKind::ChecksumMismatch
            | IncidentKind::CountMismatch
            | IncidentKind::GuardWordCorrupt
            | IncidentKind::PreflightFailed
            | IncidentKind::PageNotWritten
            | IncidentKind::ManifestMismatch => Severity::Critical,
            IncidentKind::ProbeBadStatus
            | IncidentKind::ProbeLatency
            | IncidentKind::ProbeUnreachable
            | IncidentKind::WriteRejected
            | IncidentKind::Quarantine
            | IncidentKind::DeferredReleaseTimedOut
            | IncidentKind::StaleMessage => Severity::Warning,
            IncidentKind::DeferredReleaseDrained => Severity::Info,
        }
    }
}

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
        }
        assert!("bogus".parse::<IncidentStatus>().is_err());
    }

    #[test]
    fn only_drained_releases_and_request_bound_stale_messages_are_routine() {
        let routine: Vec<(IntegrityKind, bool)> = IntegrityKind::ALL
            .iter()
            .flat_map(|k| [(*k, true), (*k, false)])
            .filter(|(k, names)| k.is_routine(*names))
            .collect();
        assert_eq!(
            routine,
            vec![
                (IntegrityKind::DeferredReleaseDrained, true),
                (IntegrityKind::DeferredReleaseDrained, false),
                (IntegrityKind::StaleMessage, true),
            ]
        );
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
