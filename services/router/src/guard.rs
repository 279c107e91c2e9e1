//! Cancellation reaches both halves (I6): an [`AbortGuard`] is armed the moment a request is
//! dispatched and, unless disarmed by a clean finish, its `Drop` spawns `Abort` to the decode and
//! the prefill worker (best effort, bounded by a short timeout). Client disconnect, deadline and
//! worker failure all end by dropping the request, so no path can forget the aborts.

use std::sync::Arc;
use std::time::Duration;

use pagewarden_proto::v1::{AbortRequest, RequestRef};
use tracing::Instrument;

use crate::metrics::{AbortLabels, Metrics};
use crate::telemetry::traced;
use crate::workers::Worker;

/// Why a request is being aborted; sent to the workers as the abort reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// The client went away (stream or future dropped). The default: any drop that nobody
    /// explained is a disconnect.
    ClientGone,
    /// `--request-timeout` passed.
    Deadline,
    /// The prefill half failed.
    PrefillFailed,
    /// The decode half failed.
    DecodeFailed,
}

impl AbortReason {
    /// Wire and log spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AbortReason::ClientGone => "client_disconnected",
            AbortReason::Deadline => "deadline",
            AbortReason::PrefillFailed => "prefill_failed",
            AbortReason::DecodeFailed => "decode_failed",
        }
    }
}

/// Fires `Abort` on both halves when dropped while armed.
pub struct AbortGuard {
    req: RequestRef,
    decode: Arc<Worker>,
    prefill: Arc<Worker>,
    metrics: Arc<Metrics>,
    timeout: Duration,
    reason: AbortReason,
    armed: bool,
}

impl AbortGuard {
    /// An armed guard for `req` dispatched to `decode` and `prefill`.
    pub fn new(
        req: RequestRef,
        decode: Arc<Worker>,
        prefill: Arc<Worker>,
        metrics: Arc<Metrics>,
        timeout: Duration,
    ) -> Self {
        Self {
            req,
            decode,
            prefill,
            metrics,
            timeout,
            reason: AbortReason::ClientGone,
            armed: true,
        }
    }

    /// Records why the request is ending, for the abort that the drop will send.
    pub fn set_reason(&mut self, reason: AbortReason) {
        self.reason = reason;
    }

    /// The request finished cleanly on both halves: nothing to abort.
    pub fn disarm(&mut self) {
        self.armed = false;
    }

    /// Whether dropping would send aborts.
    pub fn is_armed(&self) -> bool {
        self.armed
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no runtime to send aborts on; workers will time the request out");
            return;
        };
        let reason = self.reason.as_str();
        for worker in [self.decode.clone(), self.prefill.clone()] {
            let msg = AbortRequest {
                req: Some(self.req.clone()),
                reason: reason.to_string(),
            };
            let metrics = self.metrics.clone();
            let timeout = self.timeout;
            let span = tracing::info_span!("abort", half = worker.half().as_str(), reason);
            rt.spawn(
                async move {
                    let call = async {
                        match worker.half() {
                            crate::error::Half::Decode => worker.decode().abort(traced(msg)).await,
                            crate::error::Half::Prefill => {
                                worker.prefill().abort(traced(msg)).await
                            }
                        }
                    };
                    let result = match tokio::time::timeout(timeout, call).await {
                        Ok(Ok(_)) => "ok",
                        Ok(Err(status)) => {
                            tracing::warn!(%status, "abort failed");
                            "error"
                        }
                        Err(_) => {
                            tracing::warn!(?timeout, "abort timed out");
                            "timeout"
                        }
                    };
                    metrics
                        .aborts
                        .get_or_create(&AbortLabels {
                            half: worker.half().as_str(),
                            result,
                        })
                        .inc();
                }
                .instrument(span),
            );
        }
    }
}
