-- Issue 37 (SQLite): the recompute audit. Its incident kind, `recompute_mismatch` (SQLite
-- cannot change a CHECK constraint in place: the incidents table is rebuilt as in 0005), and
-- its results.

CREATE TABLE incidents_new (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            TEXT    NOT NULL CHECK (kind IN (
                        'cross_tenant_marker', 'probe_bad_status', 'probe_token_count',
                        'probe_latency', 'probe_overlength_accepted', 'probe_unreachable',
                        'side_channel', 'recompute_mismatch',
                        'generation_mismatch', 'checksum_mismatch', 'count_mismatch',
                        'guard_word_corrupt', 'write_rejected', 'quarantine',
                        'deferred_release_drained', 'deferred_release_timed_out',
                        'preflight_failed', 'page_not_written', 'manifest_mismatch',
                        'stale_message')),
    severity        TEXT    NOT NULL CHECK (severity IN ('info', 'warning', 'critical')),
    status          TEXT    NOT NULL DEFAULT 'open'
                            CHECK (status IN ('open', 'acknowledged', 'resolved')),
    node            TEXT,
    request_id      TEXT,
    tenant          TEXT,
    other_tenant    TEXT,
    details         TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    acknowledged_by TEXT,
    acknowledged_at INTEGER,
    ack_note        TEXT,
    resolved_by     TEXT,
    resolved_at     INTEGER,
    resolve_note    TEXT,
    page            INTEGER,
    generation      INTEGER,
    CHECK (status = 'open' OR acknowledged_at IS NOT NULL OR resolved_at IS NOT NULL),
    CHECK (status <> 'resolved' OR resolved_at IS NOT NULL)
);
INSERT INTO incidents_new (id, kind, severity, status, node, request_id, tenant, other_tenant,
                           details, created_at, acknowledged_by, acknowledged_at, ack_note,
                           resolved_by, resolved_at, resolve_note, page, generation)
    SELECT id, kind, severity, status, node, request_id, tenant, other_tenant,
           details, created_at, acknowledged_by, acknowledged_at, ack_note,
           resolved_by, resolved_at, resolve_note, page, generation
      FROM incidents;
DROP TABLE incidents;
ALTER TABLE incidents_new RENAME TO incidents;
CREATE INDEX incidents_status ON incidents (status, created_at);
CREATE INDEX incidents_tenant ON incidents (tenant);
CREATE INDEX incidents_page ON incidents (node, page);

-- One row per recompute audit: which request, the digests of its tokens (never the tokens),
-- and the verdict. Logprob differences are kept in millionths of a nat (integers on both
-- backends).
CREATE TABLE recomputes (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id        TEXT,
    tenant            TEXT    NOT NULL,
    decode_node       TEXT,
    prompt_tokens     INTEGER NOT NULL CHECK (prompt_tokens >= 0),
    output_tokens     INTEGER NOT NULL CHECK (output_tokens >= 0),
    -- SHA-256 of the prompt's and the output's token ids (u32 little-endian), 64 hex digits.
    prompt_sha256     TEXT    NOT NULL CHECK (length(prompt_sha256) = 64),
    output_sha256     TEXT    NOT NULL CHECK (length(output_sha256) = 64),
    verdict           TEXT    NOT NULL CHECK (verdict IN ('match', 'mismatch', 'failed')),
    max_diff_micro    INTEGER NOT NULL CHECK (max_diff_micro >= 0),
    tolerance_micro   INTEGER NOT NULL CHECK (tolerance_micro >= 0),
    -- The first output position whose logprobs differ beyond the tolerance.
    first_divergence  INTEGER,
    recompute_ms      INTEGER NOT NULL CHECK (recompute_ms >= 0),
    at                INTEGER NOT NULL
);
CREATE INDEX recomputes_at ON recomputes (at);
CREATE INDEX recomputes_verdict ON recomputes (verdict, at);
