-- Pagewarden auditor schema (PostgreSQL). Times are unix milliseconds. Every status, kind and
-- severity column is constrained; the Rust enums in services/auditor/src/domain.rs mirror them.

CREATE TABLE incidents (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
    created_at      BIGINT NOT NULL,
    acknowledged_by TEXT,
    acknowledged_at BIGINT,
    ack_note        TEXT,
    resolved_by     TEXT,
    resolved_at     BIGINT,
    resolve_note    TEXT,
    CHECK (status = 'open' OR acknowledged_at IS NOT NULL OR resolved_at IS NOT NULL),
    CHECK (status <> 'resolved' OR resolved_at IS NOT NULL)
);
CREATE INDEX incidents_status ON incidents (status, created_at);
CREATE INDEX incidents_tenant ON incidents (tenant);

CREATE TABLE probe_runs (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at    BIGINT NOT NULL,
    finished_at   BIGINT,
    status        TEXT    NOT NULL CHECK (status IN ('running', 'passed', 'failed', 'error')),
    context_limit BIGINT,
    steps         BIGINT NOT NULL DEFAULT 0,
    failures      BIGINT NOT NULL DEFAULT 0,
    message       TEXT    NOT NULL DEFAULT ''
);

CREATE TABLE probe_results (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id          BIGINT NOT NULL REFERENCES probe_runs (id),
    tenant          TEXT    NOT NULL,
    step            BIGINT NOT NULL,
    prompt_words    BIGINT NOT NULL,
    expected_tokens BIGINT,
    outcome         TEXT    NOT NULL CHECK (outcome IN (
                        'accepted', 'rejected_clean', 'bad_status', 'token_mismatch',
                        'latency_implausible', 'overlength_accepted', 'leak', 'transport_error')),
    http_status     BIGINT,
    prompt_tokens   BIGINT,
    ttft_ms         BIGINT,
    detail          TEXT    NOT NULL DEFAULT '',
    at              BIGINT NOT NULL
);
CREATE INDEX probe_results_run ON probe_results (run_id);

CREATE TABLE samples (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant            TEXT    NOT NULL,
    request_id        TEXT,
    node              TEXT,
    prompt_tokens     BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    response_digest   TEXT    NOT NULL,
    scanned           BIGINT NOT NULL CHECK (scanned IN (0, 1)),
    foreign_markers   BIGINT NOT NULL DEFAULT 0,
    ttft_ms           BIGINT,
    status            TEXT    NOT NULL CHECK (status IN ('ok', 'rejected', 'error', 'cancelled')),
    at                BIGINT NOT NULL
);
CREATE INDEX samples_at ON samples (at);

CREATE TABLE integrity_events (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        TEXT    NOT NULL CHECK (kind IN (
                    'generation_mismatch', 'checksum_mismatch', 'count_mismatch',
                    'guard_word_corrupt', 'write_rejected', 'quarantine',
                    'deferred_release_drained', 'deferred_release_timed_out',
                    'preflight_failed', 'page_not_written', 'manifest_mismatch',
                    'stale_message')),
    node        TEXT    NOT NULL,
    request_id  TEXT,
    tenant      TEXT,
    page        BIGINT,
    generation  BIGINT,
    details     TEXT    NOT NULL DEFAULT '',
    at          BIGINT NOT NULL
);
CREATE INDEX integrity_events_at ON integrity_events (at);

CREATE TABLE preflight_reports (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    node           TEXT    NOT NULL,
    role           TEXT    NOT NULL CHECK (role IN ('prefill', 'decode')),
    pool_tokens    BIGINT NOT NULL,
    context_length BIGINT NOT NULL,
    ok             BIGINT NOT NULL CHECK (ok IN (0, 1)),
    message        TEXT    NOT NULL DEFAULT '',
    at             BIGINT NOT NULL
);
CREATE INDEX preflight_reports_node ON preflight_reports (node, at);

CREATE TABLE markers (
    marker    TEXT    PRIMARY KEY,
    tenant    TEXT    NOT NULL,
    issued_at BIGINT NOT NULL
);
