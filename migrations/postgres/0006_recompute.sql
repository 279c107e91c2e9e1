-- Issue 37 (PostgreSQL): the recompute audit's incident kind, `recompute_mismatch`, and its
-- results.

ALTER TABLE incidents DROP CONSTRAINT incidents_kind_check;
ALTER TABLE incidents ADD CONSTRAINT incidents_kind_check CHECK (kind IN (
    'cross_tenant_marker', 'probe_bad_status', 'probe_token_count',
    'probe_latency', 'probe_overlength_accepted', 'probe_unreachable', 'side_channel',
    'recompute_mismatch',
    'generation_mismatch', 'checksum_mismatch', 'count_mismatch',
    'guard_word_corrupt', 'write_rejected', 'quarantine',
    'deferred_release_drained', 'deferred_release_timed_out',
    'preflight_failed', 'page_not_written', 'manifest_mismatch',
    'stale_message'));

-- One row per recompute audit: which request, the digests of its tokens (never the tokens),
-- and the verdict. Logprob differences are kept in millionths of a nat (integers on both
-- backends).
CREATE TABLE recomputes (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id        TEXT,
    tenant            TEXT    NOT NULL,
    decode_node       TEXT,
    prompt_tokens     BIGINT  NOT NULL CHECK (prompt_tokens >= 0),
    output_tokens     BIGINT  NOT NULL CHECK (output_tokens >= 0),
    -- SHA-256 of the prompt's and the output's token ids (u32 little-endian), 64 hex digits.
    prompt_sha256     TEXT    NOT NULL CHECK (length(prompt_sha256) = 64),
    output_sha256     TEXT    NOT NULL CHECK (length(output_sha256) = 64),
    verdict           TEXT    NOT NULL CHECK (verdict IN ('match', 'mismatch', 'failed')),
    max_diff_micro    BIGINT  NOT NULL CHECK (max_diff_micro >= 0),
    tolerance_micro   BIGINT  NOT NULL CHECK (tolerance_micro >= 0),
    -- The first output position whose logprobs differ beyond the tolerance.
    first_divergence  BIGINT,
    recompute_ms      BIGINT  NOT NULL CHECK (recompute_ms >= 0),
    at                BIGINT  NOT NULL
);
CREATE INDEX recomputes_at ON recomputes (at);
CREATE INDEX recomputes_verdict ON recomputes (verdict, at);
