//! Refused transfer connections, summarized per source address: the first refusal of a source
//! in a window is logged and reported at once; the rest of that window are only counted, and
//! reported as one summary (with their count) when the window ends. So a flood from one source
//! costs at most one log line and one report per window, however many sockets it opens.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::secure::{ListenOptions, Refused, RefusedReason};

/// Sources tracked at most; past it, the one whose window began longest ago is forgotten.
const MAX_SOURCES: usize = 4096;

#[derive(Debug)]
struct Source {
    /// When this source's current window began (its last report).
    since: Instant,
    /// Refusals since that report, not reported yet.
    suppressed: u64,
    /// The last of them.
    last: Option<(SocketAddr, RefusedReason)>,
}

/// Per-source refusal windows of one listener.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    window: Duration,
    sources: Mutex<HashMap<IpAddr, Source>>,
}

impl RefusalLog {
    pub(crate) fn new(window: Duration) -> Self {
        RefusalLog {
            window,
            sources: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one refusal; returns the report to make now, if any.
    pub(crate) fn refused(
        &self,
        peer: SocketAddr,
        reason: RefusedReason,
        now: Instant,
    ) -> Option<Refused> {
        let mut sources = self.sources.lock();
        if sources.len() >= MAX_SOURCES && !sources.contains_key(&peer.ip()) {
            if let Some(oldest) = sources
                .iter()
                .min_by_key(|(_, s)| s.since)
                .map(|(ip, _)| *ip)
            {
                sources.remove(&oldest);
            }
        }
        match sources.get_mut(&peer.ip()) {
            Some(s) if now.saturating_duration_since(s.since) < self.window => {
                s.suppressed += 1;
                s.last = Some((peer, reason));
                None
            }
            Some(s) => {
                let count = s.suppressed + 1;
                *s = Source {
                    since: now,
                    suppressed: 0,
                    last: None,
                };
                Some(Refused {
                    peer,
                    reason,
                    count,
                })
            }
            None => {
                sources.insert(
                    peer.ip(),
                    Source {
                        since: now,
                        suppressed: 0,
                        last: None,
                    },
                );
                Some(Refused {
                    peer,
                    reason,
                    count: 1,
                })
            }
        }
    }

    /// Ends every window that has run out: one summary per source that was refused again in
    /// it; sources quiet for a whole window are forgotten.
    pub(crate) fn flush(&self, now: Instant) -> Vec<Refused> {
        let mut sources = self.sources.lock();
        let mut out = Vec::new();
        sources.retain(|_, s| {
            if now.saturating_duration_since(s.since) < self.window {
                return true;
            }
            match s.last.take() {
                Some((peer, reason)) => {
                    out.push(Refused {
                        peer,
                        reason,
                        count: s.suppressed,
                    });
                    s.since = now;
                    s.suppressed = 0;
                    true
                }
                None => false,
            }
        });
        out
    }
}

/// Logs and hands on one report (the first refusal of a window, or a window's summary).
pub(crate) fn report(opts: &ListenOptions, r: &Refused) {
    if r.count <= 1 {
        tracing::warn!(peer = %r.peer, reason = %r.reason, "transfer connection refused");
    } else {
        tracing::warn!(
            source = %r.peer.ip(),
            count = r.count,
            last_reason = %r.reason,
            window = ?opts.refusal_window,
            "transfer connections refused from one source (summary of its window)"
        );
    }
    if let Some(hook) = &opts.on_refused {
        hook(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(last: u8, port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], port))
    }

    #[test]
    fn a_flood_from_one_source_is_one_report_per_window_with_its_count() {
        let log = RefusalLog::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let r = log
            .refused(peer(1, 1), RefusedReason::HandshakeTimeout, t0)
            .expect("the first is reported");
        assert_eq!(r.count, 1);
        for i in 0..999 {
            assert!(log
                .refused(peer(1, 2 + i), RefusedReason::TooManyConnections, t0)
                .is_none());
        }
        assert!(
            log.refused(peer(2, 1), RefusedReason::HandshakeTimeout, t0)
                .is_some(),
            "another source has its own window"
        );
        assert!(log.flush(t0 + Duration::from_secs(59)).is_empty());
        let summary = log.flush(t0 + Duration::from_secs(60));
        assert_eq!(summary.len(), 1, "source 2 was quiet after its first");
        assert_eq!(summary[0].peer.ip(), peer(1, 0).ip());
        assert_eq!(summary[0].count, 999);
        assert!(
            log.refused(
                peer(1, 9),
                RefusedReason::HandshakeTimeout,
                t0 + Duration::from_secs(61)
            )
            .is_none(),
            "the summary opened a new window"
        );
        assert_eq!(log.flush(t0 + Duration::from_secs(120))[0].count, 1);
        assert!(log.flush(t0 + Duration::from_secs(180)).is_empty());
        assert!(log.sources.lock().is_empty(), "quiet sources are forgotten");
    }
}
