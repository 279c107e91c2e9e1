//! Copies the KV pool's gauges and counters into the Prometheus registry at scrape time.

use std::sync::Arc;

use pagewarden_common::metrics::{RefreshHook, WorkerMetrics};
use pagewarden_kvcache::KvPool;
use pagewarden_transfer::ReceiverCounters;

/// A refresh hook for `serve_metrics` mirroring `pool` and the transfer receiver's counters.
pub fn hook(pool: KvPool, receiver: Arc<ReceiverCounters>) -> RefreshHook {
    Arc::new(move |m: &WorkerMetrics| {
        let r = receiver.snapshot();
        m.mirror_transfer_bytes(r.bytes_ok);
        m.mirror_integrity("transfer_malformed", r.malformed_closes);
        m.mirror_deferred_release("peer_gone", r.peer_gone);
        m.set_pool(pagewarden_worker::pool_gauges(&pool));
        let c = pool.metrics().snapshot();
        m.mirror_deferred_release("drained", c.deferred_drained);
        m.mirror_deferred_release("quarantined", c.deferred_timed_out);
        m.mirror_deferred_release("quarantine_released", c.deferred_quarantine_released);
        for (kind, total) in [
            ("generation_mismatch", c.generation_mismatches),
            ("guard_word", c.guard_word_failures),
            ("write_unknown_grant", c.write_unknown_grant),
            ("write_revoked_grant", c.write_revoked_grant),
            ("write_wrong_page", c.write_wrong_page),
            ("write_stale_generation", c.write_stale_generation),
            ("write_duplicate", c.write_duplicate),
            ("write_bad_length", c.write_bad_length),
            ("write_too_many_tokens", c.write_too_many_tokens),
            ("write_checksum_mismatch", c.write_checksum_mismatch),
            ("commit_key_mismatch", c.commit_key_mismatch),
            ("commit_token_count_mismatch", c.commit_token_count_mismatch),
            ("commit_page_not_written", c.commit_page_not_written),
            ("commit_checksum_mismatch", c.commit_checksum_mismatch),
            ("commit_guard_word_corrupt", c.commit_guard_word_corrupt),
            ("commit_digest_mismatch", c.commit_digest_mismatch),
            ("commit_expired", c.commit_expired),
        ] {
            m.mirror_integrity(kind, total);
        }
    })
}
