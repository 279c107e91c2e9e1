-- Issue 15 (PostgreSQL): the workers' prefix-cache events, per namespace (I10).

CREATE TABLE cache_events (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind           TEXT   NOT NULL CHECK (kind IN ('hit', 'miss', 'eviction')),
    node           TEXT   NOT NULL,
    role           TEXT   NOT NULL CHECK (role IN ('prefill', 'decode')),
    -- Hit, miss: whose prompt. Eviction: who last used the namespace there (may be unknown).
    tenant         TEXT,
    -- The namespace's tag (8 hex digits), never its key.
    namespace      TEXT   NOT NULL,
    request_id     TEXT,
    prompt_tokens  BIGINT NOT NULL DEFAULT 0,
    cached_tokens  BIGINT NOT NULL DEFAULT 0,
    pages          BIGINT NOT NULL DEFAULT 0,
    at             BIGINT NOT NULL
);
CREATE INDEX cache_events_at ON cache_events (at);
CREATE INDEX cache_events_namespace ON cache_events (namespace, tenant);
