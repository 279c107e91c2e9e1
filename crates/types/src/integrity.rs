//! Integrity events (I8): what a worker detected, as it reports it and as the auditor files it.
//! [`IntegrityKind`] is the one list of kinds: the wire enum (`pagewarden.v1.IntegrityKind`) is
//! pinned to it by a round-trip test in `pagewarden-proto`, the auditor's incident kinds wrap it,
//! and its spellings are the database's, the metrics' labels and the JSON's.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{RequestId, TenantId, UnknownValue};

/// What kind of violation, or of release outcome, was detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntegrityKind {
    /// A read presented a stale (page, generation) (I1).
    GenerationMismatch,
    /// A page's bytes did not match the manifest's checksum (I2).
    ChecksumMismatch,
    /// Tokens written differed from tokens reserved (I2).
    CountMismatch,
    /// A page's guard word was overwritten (I2).
    GuardWordCorrupt,
    /// A write carried a revoked or unknown grant key (I4).
    WriteRejected,
    /// Pages went to quarantine because their drain could not be confirmed (I4).
    Quarantine,
    /// A deferred release was confirmed drained (I4 working as designed).
    DeferredReleaseDrained,
    /// A deferred release gave up waiting.
    DeferredReleaseTimedOut,
    /// A worker's pool could not hold its advertised context (I7).
    PreflightFailed,
    /// A granted page was never written (I2).
    PageNotWritten,
    /// The commit manifest's digest or grant key did not match (I2).
    ManifestMismatch,
    /// A stale message (old attempt, revoked grant) was dropped and counted (I5).
    StaleMessage,
}

impl IntegrityKind {
    /// Every kind, in the wire enum's order.
    pub const ALL: &'static [IntegrityKind] = &[
        IntegrityKind::GenerationMismatch,
        IntegrityKind::ChecksumMismatch,
        IntegrityKind::CountMismatch,
        IntegrityKind::GuardWordCorrupt,
        IntegrityKind::WriteRejected,
        IntegrityKind::Quarantine,
        IntegrityKind::DeferredReleaseDrained,
        IntegrityKind::DeferredReleaseTimedOut,
        IntegrityKind::PreflightFailed,
        IntegrityKind::PageNotWritten,
        IntegrityKind::ManifestMismatch,
        IntegrityKind::StaleMessage,
    ];

    /// The spelling in the database, in metrics' labels, in URLs and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            IntegrityKind::GenerationMismatch => "generation_mismatch",
            IntegrityKind::ChecksumMismatch => "checksum_mismatch",
            IntegrityKind::CountMismatch => "count_mismatch",
            IntegrityKind::GuardWordCorrupt => "guard_word_corrupt",
            IntegrityKind::WriteRejected => "write_rejected",
            IntegrityKind::Quarantine => "quarantine",
            IntegrityKind::DeferredReleaseDrained => "deferred_release_drained",
            IntegrityKind::DeferredReleaseTimedOut => "deferred_release_timed_out",
            IntegrityKind::PreflightFailed => "preflight_failed",
            IntegrityKind::PageNotWritten => "page_not_written",
            IntegrityKind::ManifestMismatch => "manifest_mismatch",
            IntegrityKind::StaleMessage => "stale_message",
        }
    }

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

impl FromStr for IntegrityKind {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IntegrityKind::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownValue {
                what: "integrity kind",
                value: s.to_string(),
            })
    }
}

impl fmt::Display for IntegrityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The KV page an event concerns, as the auditor files it: incidents that share a page link
/// to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageTag {
    /// The page's index in the reporting worker's pool.
    pub page: u32,
    /// The page generation the event is about.
    pub generation: u64,
}

/// One detected event.
#[derive(Debug, Clone)]
pub struct IntegrityEvent {
    /// The reporting node.
    pub node_id: String,
    /// "prefill" or "decode".
    pub role: &'static str,
    /// What happened.
    pub kind: IntegrityKind,
    /// The affected request, if known.
    pub request: Option<RequestId>,
    /// Its tenant, if known.
    pub tenant: Option<TenantId>,
    /// The page it concerns, if one.
    pub page: Option<PageTag>,
    /// Human-readable detail (the typed error's message).
    pub detail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_parses_back_and_serializes_the_same() {
        for k in IntegrityKind::ALL {
            assert_eq!(k.as_str().parse::<IntegrityKind>().unwrap(), *k);
            let json = serde_json::to_string(k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
        }
        assert!("token_count_mismatch".parse::<IntegrityKind>().is_err());
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
}
