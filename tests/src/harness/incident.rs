//! The incident script. Tenant A: one finished request (its KV stays in decode's freed
//! pages), one request aborted mid-transfer whose writes the transport holds (and whose
//! drain it confirms at once), and one request in flight on prefill (holding the aborted
//! request's former prefill pages). Tenant B: a prompt longer than the prefill pool but
//! within the advertised context. The held writes are released while B is between transfer
//! and commit. With every defense off, A's bytes reach B's response by this single chain:
//! B admitted (router, workers) → held write reads A's live prefill page through a stale
//! table (read generation) → lands on B's page under A's dead grant (grant fencing) → B's
//! commit with fewer tokens than reserved (token count) over bytes that no longer match the
//! manifest (checksums) → B reads. Each defense alone cuts the chain.

use pagewarden_common::integrity::IntegrityEvent;
use pagewarden_kvcache::PoolStats;

use super::cluster::{Cluster, Failure, Response, PREFILL_PAGES};
use super::layers::Layers;
use super::markers::{contains_marker, contains_marker_fragment, A, B};

/// B's prompt: longer than the prefill pool (128), within the advertised context (512).
pub const B_PROMPT: usize = 200;
/// B's `max_tokens`.
pub const B_MAX_TOKENS: usize = 16;

/// What happened to B, and around it.
#[derive(Debug)]
pub struct Outcome {
    /// B's result.
    pub b: Result<Response, Failure>,
    /// Pool stats (decode, prefill) just before B's request.
    pub before_b: (PoolStats, PoolStats),
    /// Pool stats just after B's request returned (A's in-flight request still held).
    pub after_b: (PoolStats, PoolStats),
    /// Pool stats after everything finished.
    pub end: (PoolStats, PoolStats),
    /// Integrity events the cluster recorded.
    pub events: Vec<IntegrityEvent>,
}

impl Outcome {
    /// Whether B's response holds any of A's bytes (a whole marker or a fragment).
    pub fn leaked(&self) -> bool {
        match &self.b {
            Ok(r) => {
                contains_marker(&r.bytes, A.marker) || contains_marker_fragment(&r.bytes, A.marker)
            }
            Err(_) => false,
        }
    }

    /// Whether B's response holds its own marker (it saw its own KV).
    pub fn b_saw_own(&self) -> bool {
        matches!(&self.b, Ok(r) if contains_marker(&r.bytes, B.marker))
    }

    /// Whether B was refused with a 400 by admission.
    pub fn rejected_400(&self) -> bool {
        matches!(&self.b, Err(Failure::Rejected { .. }))
    }
}

/// Runs the script under `layers`.
pub async fn run(layers: Layers) -> Outcome {
    let c = Cluster::new(layers).await;
    // A1 completes: its KV stays in decode's free pages (no zeroing).
    let a1 = c
        .serve(&A, 48, 16, None)
        .await
        .expect("A's normal request is served");
    assert!(contains_marker(&a1.bytes, A.marker));
    // A2 is aborted mid-transfer; the transport holds its writes.
    let held = c.start_then_abort(&A, 32).await;
    // A3 is in flight on prefill and holds A2's former prefill pages.
    let mut a3 = c.prefill_compute(&A, 32).expect("A3 prefill");
    assert!(a3.table().len() < PREFILL_PAGES);
    let before_b = c.stats();
    let b = {
        let mut live = [&mut a3];
        c.serve(&B, B_PROMPT, B_MAX_TOKENS, Some((&held, &mut live[..])))
            .await
    };
    let after_b = c.stats();
    let events = c.events();
    drop(a3);
    Outcome {
        b,
        before_b,
        after_b,
        end: c.stats(),
        events,
    }
}
