//! One worker as the router's `/health` reports it, and as the auditor's overview reads it:
//! its role, the node id it last advertised, its liveness, and what its last answer said of
//! its load, device and build. No address: `/health` is public.

use serde::{Deserialize, Serialize};

/// A worker's liveness as the router last saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    /// Its last `Info` poll was answered: it takes requests.
    Live,
    /// Its last poll failed, or it refused the poll (a draining decode does).
    Down,
    /// Not polled yet.
    Unknown,
}

/// One worker in `/health`'s `workers` list. The load, device and build fields are those of
/// its last answer, and absent unless it is live.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct WorkerStatus {
    /// `prefill` or `decode`.
    pub role: String,
    /// The node id it last advertised (none before its first answer).
    pub node_id: Option<String>,
    /// Its liveness.
    pub state: WorkerState,
    /// Why it is down.
    #[serde(default)]
    pub error: Option<String>,
    /// Advertised context (after its preflight).
    #[serde(default)]
    pub context_length: Option<u32>,
    /// KV pages in its pool.
    #[serde(default)]
    pub total_pages: Option<u64>,
    /// KV pages an allocation could take at the last poll.
    #[serde(default)]
    pub free_pages: Option<u64>,
    /// Requests active at the last poll.
    #[serde(default)]
    pub active_requests: Option<u32>,
    /// Requests waiting in its queue at the last poll.
    #[serde(default)]
    pub queue_depth: Option<u32>,
    /// Its forward pass's arithmetic, which names the device (`cpu:avx512`, `cuda`).
    #[serde(default)]
    pub arithmetic: Option<String>,
    /// Its build's version.
    #[serde(default)]
    pub version: Option<String>,
}

impl WorkerStatus {
    /// The share of its KV pool in use at the last poll, 0 to 1 (live workers with a pool).
    pub fn kv_usage(&self) -> Option<f64> {
        let (total, free) = (self.total_pages?, self.free_pages?);
        (total > 0).then(|| total.saturating_sub(free) as f64 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_usage_is_the_share_of_pages_taken() {
        let mut w = WorkerStatus {
            role: "decode".into(),
            node_id: Some("decode-0".into()),
            state: WorkerState::Live,
            error: None,
            context_length: Some(2048),
            total_pages: Some(64),
            free_pages: Some(48),
            active_requests: Some(1),
            queue_depth: Some(0),
            arithmetic: Some("cpu:avx512".into()),
            version: Some("0.1.0".into()),
        };
        assert_eq!(w.kv_usage(), Some(0.25));
        w.total_pages = Some(0);
        assert_eq!(w.kv_usage(), None);
        w.total_pages = None;
        assert_eq!(w.kv_usage(), None);
        let json = serde_json::to_value(&w).unwrap();
        assert_eq!(json["state"], "live");
        assert_eq!(serde_json::from_value::<WorkerStatus>(json).unwrap(), w);
    }
}
