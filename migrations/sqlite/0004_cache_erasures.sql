-- Issue 37 (SQLite): tenants' prefix-cache erasures (DELETE /v1/cache at the router), each with the
-- certificate the tenant was given: counts and digests only, never a prompt.

CREATE TABLE cache_erasures (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant      TEXT    NOT NULL,
    -- The namespace's tag (8 hex digits), never its key.
    namespace   TEXT    NOT NULL,
    -- The certificate's SHA-256 over every worker's part, 64 hex digits.
    digest      TEXT    NOT NULL CHECK (length(digest) = 64),
    at          INTEGER NOT NULL
);
CREATE INDEX cache_erasures_at ON cache_erasures (at);
CREATE INDEX cache_erasures_tenant ON cache_erasures (tenant, at);

-- One row per worker that erased: its part of the certificate.
CREATE TABLE cache_erasure_workers (
    erasure_id     INTEGER NOT NULL REFERENCES cache_erasures (id),
    node           TEXT    NOT NULL,
    role           TEXT    NOT NULL CHECK (role IN ('prefill', 'decode')),
    entries        INTEGER NOT NULL CHECK (entries >= 0),
    pages_zeroed   INTEGER NOT NULL CHECK (pages_zeroed >= 0),
    pages_deferred INTEGER NOT NULL CHECK (pages_deferred >= 0),
    digest         TEXT    NOT NULL CHECK (length(digest) = 64),
    CHECK (entries = pages_zeroed + pages_deferred)
);
CREATE INDEX cache_erasure_workers_erasure ON cache_erasure_workers (erasure_id);
