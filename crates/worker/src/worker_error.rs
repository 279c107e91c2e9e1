//! `WorkerError`: why a worker refused or ended a request, as its scheduler and pipeline say
//! it, and the one mapping of it to the wire's status (`From<WorkerError> for Status`). Only
//! the parsing of a message (`wire.rs`) makes a status of its own: `INVALID_ARGUMENT`.

use pagewarden_common::admission::Rejection;
use pagewarden_common::reject_reason::RejectReason;
use pagewarden_proto::convert::rejected;
use tonic::{Code, Status};

/// Why a worker refused or ended a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkerError {
    /// Admission refused it (I3): the prompt and `max_tokens` do not fit the context or the
    /// pool. `INVALID_ARGUMENT`, with the reason in its details.
    #[error("{0}")]
    Rejected(Rejection),
    /// The request is malformed in a way only the worker can see. `INVALID_ARGUMENT`.
    #[error("{0}")]
    Invalid(String),
    /// It fits, but its wait was bounded (`QueueRefusal`). `RESOURCE_EXHAUSTED`, with the
    /// reason in its details.
    #[error("{role} {refusal}")]
    Queue {
        /// The worker (`prefill`, `decode`), named in the message.
        role: &'static str,
        /// Which bound.
        refusal: QueueRefusal,
    },
    /// No such request here. `NOT_FOUND`.
    #[error("{0}")]
    NotFound(String),
    /// A message for an older attempt, or for a request in another state (I5). `ABORTED`.
    #[error("stale message: {0}")]
    Stale(String),
    /// The commit check refused the pages (I2). `FAILED_PRECONDITION`.
    #[error("commit refused: {0}")]
    CommitRefused(String),
    /// Aborted by the caller. `CANCELLED`.
    #[error("{0}")]
    Cancelled(String),
    /// The worker, or a peer it needs, cannot serve now. `UNAVAILABLE`.
    #[error("{0}")]
    Unavailable(String),
    /// A failure of the worker itself. `INTERNAL`.
    #[error("{0}")]
    Internal(String),
}

impl From<WorkerError> for Status {
    fn from(e: WorkerError) -> Status {
        let message = e.to_string();
        match &e {
            WorkerError::Rejected(r) => rejected(Code::InvalidArgument, message, r.reason()),
            WorkerError::Invalid(_) => Status::invalid_argument(message),
            WorkerError::Queue { refusal, .. } => {
                rejected(Code::ResourceExhausted, message, refusal.reason())
            }
            WorkerError::NotFound(_) => Status::not_found(message),
            WorkerError::Stale(_) => Status::aborted(message),
            WorkerError::CommitRefused(_) => Status::failed_precondition(message),
            WorkerError::Cancelled(_) => Status::cancelled(message),
            WorkerError::Unavailable(_) => Status::unavailable(message),
            WorkerError::Internal(_) => Status::internal(message),
        }
    }
}

/// Why a request that fits the context was refused after all: the wait for pages or compute is
/// bounded in length and in time. On the wire: `RESOURCE_EXHAUSTED` with the reason
/// `QueueFull` or `QueueTimeout` in its details (the router answers 503 with `Retry-After`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueRefusal {
    /// `limit` requests already wait.
    Full {
        /// The configured bound (`--max-queue`).
        limit: usize,
    },
    /// The request waited its whole `--queue-timeout`.
    Timeout {
        /// The configured bound.
        waited: std::time::Duration,
    },
}

impl QueueRefusal {
    /// The reason the refusing status carries and metrics count.
    pub fn reason(self) -> RejectReason {
        match self {
            QueueRefusal::Full { .. } => RejectReason::QueueFull,
            QueueRefusal::Timeout { .. } => RejectReason::QueueTimeout,
        }
    }

    /// The error `role`'s scheduler answers with.
    pub fn error(self, role: &'static str) -> WorkerError {
        WorkerError::Queue {
            role,
            refusal: self,
        }
    }
}

impl std::fmt::Display for QueueRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueRefusal::Full { limit } => {
                write!(f, "queue full: {limit} requests already wait for KV pages")
            }
            QueueRefusal::Timeout { waited } => {
                write!(f, "queue deadline passed: waited {waited:?} for KV pages")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewarden_proto::convert::reject_reason;

    /// Every error has its code, and the two a router answers with a reason carry it.
    #[test]
    fn each_error_has_its_code_and_reason() {
        let cases = [
            (
                WorkerError::Rejected(Rejection::ContextLengthExceeded {
                    prompt_tokens: 10,
                    max_tokens: 5,
                    context: 12,
                }),
                Code::InvalidArgument,
                Some(RejectReason::ContextLengthExceeded),
            ),
            (
                WorkerError::Invalid("x".into()),
                Code::InvalidArgument,
                None,
            ),
            (
                QueueRefusal::Full { limit: 3 }.error("decode"),
                Code::ResourceExhausted,
                Some(RejectReason::QueueFull),
            ),
            (WorkerError::NotFound("x".into()), Code::NotFound, None),
            (WorkerError::Stale("x".into()), Code::Aborted, None),
            (
                WorkerError::CommitRefused("x".into()),
                Code::FailedPrecondition,
                None,
            ),
            (WorkerError::Cancelled("x".into()), Code::Cancelled, None),
            (
                WorkerError::Unavailable("x".into()),
                Code::Unavailable,
                None,
            ),
            (WorkerError::Internal("x".into()), Code::Internal, None),
        ];
        for (e, code, reason) in cases {
            let s = Status::from(e.clone());
            assert_eq!(s.code(), code, "{e:?}");
            assert_eq!(s.message(), e.to_string());
            assert_eq!(reject_reason(&s), reason, "{e:?}");
        }
        assert_eq!(
            Status::from(QueueRefusal::Full { limit: 3 }.error("prefill")).message(),
            "prefill queue full: 3 requests already wait for KV pages"
        );
    }
}
