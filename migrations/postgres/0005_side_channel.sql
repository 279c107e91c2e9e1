-- Issue 37 (PostgreSQL): the side-channel audit's incident kind, `side_channel`.

ALTER TABLE incidents DROP CONSTRAINT incidents_kind_check;
ALTER TABLE incidents ADD CONSTRAINT incidents_kind_check CHECK (kind IN (
    'cross_tenant_marker', 'probe_bad_status', 'probe_token_count',
    'probe_latency', 'probe_overlength_accepted', 'probe_unreachable', 'side_channel',
    'generation_mismatch', 'checksum_mismatch', 'count_mismatch',
    'guard_word_corrupt', 'write_rejected', 'quarantine',
    'deferred_release_drained', 'deferred_release_timed_out',
    'preflight_failed', 'page_not_written', 'manifest_mismatch',
    'stale_message'));
