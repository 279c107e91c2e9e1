-- Pagewarden auditor schema (SQLite). Times are unix milliseconds. Every status, kind and
-- severity column is constrained; the Rust enums in services/auditor/src/domain.rs mirror them.

CREATE TABLE incidents (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            TEXT    NOT NULL CHECK (kind IN (
                        'cross_tenant_marker', 'probe_bad_status', 'probe_token_count',
                        'probe_latency', 'probe_overlength_accepted', 'probe_unreachable',
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
    CHECK (status = 'open' OR acknowledged_at IS NOT NULL OR resolved_at IS NOT NULL),
    CHECK (status <> 'resolved' OR resolved_at IS NOT NULL)
);
CREATE INDEX incidents_status ON incidents (status, created_at);
CREATE INDEX incidents_tenant ON incidents (tenant);

CREATE TABLE probe_runs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    status        TEXT    NOT NULL CHECK (status IN ('running', 'passed', 'failed', 'error')),
    context_limit INTEGER,
    steps         INTEGER NOT NULL DEFAULT 0,
    failures      INTEGER NOT NULL DEFAULT 0,
    message       TEXT    NOT NULL DEFAULT ''
);

CREATE TABLE probe_results (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          INTEGER NOT NULL REFERENCES probe_runs (id),
    tenant          TEXT    NOT NULL,
    step            INTEGER NOT NULL,
    prompt_words    INTEGER NOT NULL,
    expected_tokens INTEGER,
    outcome         TEXT    NOT NULL CHECK (outcome IN (
                        'accepted', 'rejected_clean', 'bad_status', 'token_mismatch',
                        'latency_implausible', 'overlength_accepted', 'leak', 'transport_error')),
    http_status     INTEGER,
    prompt_tokens   INTEGER,
    ttft_ms         INTEGER,
    detail          TEXT    NOT NULL DEFAULT '',
    at              INTEGER NOT NULL
);
CREATE INDEX probe_results_run ON probe_results (run_id);

CREATE TABLE samples (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant            TEXT    NOT NULL,
    request_id        TEXT,
    node              TEXT,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    response_digest   TEXT    NOT NULL,
    scanned           INTEGER NOT NULL CHECK (scanned IN (0, 1)),
    foreign_markers   INTEGER NOT NULL DEFAULT 0,
    ttft_ms           INTEGER,
    status            TEXT    NOT NULL CHECK (status IN ('ok', 'rejected', 'error', 'cancelled')),
    at                INTEGER NOT NULL
);
CREATE INDEX samples_at ON samples (at);

CREATE TABLE integrity_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT    NOT NULL CHECK (kind IN (
                    'generation_mismatch', 'checksum_mismatch', 'count_mismatch',
                    'guard_word_corrupt', 'write_rejected', 'quarantine',
                    'deferred_release_drained', 'deferred_release_timed_out',
                    'preflight_failed', 'page_not_written', 'manifest_mismatch',
                    'stale_message')),
    node        TEXT    NOT NULL,
    request_id  TEXT,
    tenant      TEXT,
    page        INTEGER,
    generation  INTEGER,
    details     TEXT    NOT NULL DEFAULT '',
    at          INTEGER NOT NULL
);
CREATE INDEX integrity_events_at ON integrity_events (at);

CREATE TABLE preflight_reports (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    node           TEXT    NOT NULL,
    role           TEXT    NOT NULL CHECK (role IN ('prefill', 'decode')),
    pool_tokens    INTEGER NOT NULL,
    context_length INTEGER NOT NULL,
    ok             INTEGER NOT NULL CHECK (ok IN (0, 1)),
    message        TEXT    NOT NULL DEFAULT '',
    at             INTEGER NOT NULL
);
CREATE INDEX preflight_reports_node ON preflight_reports (node, at);

CREATE TABLE markers (
    marker    TEXT    PRIMARY KEY,
    tenant    TEXT    NOT NULL,
    issued_at INTEGER NOT NULL
);
