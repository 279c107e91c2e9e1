-- Issue 15 (SQLite): the workers' prefix-cache events, per namespace (I10).

CREATE TABLE cache_events (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    kind           TEXT    NOT NULL CHECK (kind IN ('hit', 'miss', 'eviction')),
    node           TEXT    NOT NULL,
    role           TEXT    NOT NULL CHECK (role IN ('prefill', 'decode')),
    -- Hit, miss: whose prompt. Eviction: who last used the namespace there (may be unknown).
    tenant         TEXT,
    -- The namespace's tag (8 hex digits), never its key.
    namespace      TEXT    NOT NULL,
    request_id     TEXT,
    prompt_tokens  INTEGER NOT NULL DEFAULT 0,
    cached_tokens  INTEGER NOT NULL DEFAULT 0,
    pages          INTEGER NOT NULL DEFAULT 0,
    at             INTEGER NOT NULL
);
CREATE INDEX cache_events_at ON cache_events (at);
CREATE INDEX cache_events_namespace ON cache_events (namespace, tenant);
