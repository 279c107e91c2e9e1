-- Issue 37 (SQLite): the side-channel audit's incident kind, `side_channel`. SQLite cannot
-- change a CHECK constraint in place, so the table is rebuilt with the same columns (in the
-- same order, ids kept) and its indexes made again.

CREATE TABLE incidents_new (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            TEXT    NOT NULL CHECK (kind IN (
                        'cross_tenant_marker', 'probe_bad_status', 'probe_token_count',
                        'probe_latency', 'probe_overlength_accepted', 'probe_unreachable',
                        'side_channel',
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
