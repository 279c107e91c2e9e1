-- Issue 38 (PostgreSQL): how many cached pages each namespace holds on each worker, as the
-- worker last said (a `held` cache report after each publish, eviction and erasure): a state,
-- one row per worker and namespace, so the tenants page can show the pages each tenant holds
-- now.

CREATE TABLE cache_held (
    node      TEXT   NOT NULL,
    -- The namespace's tag (8 hex digits), never its key.
    namespace TEXT   NOT NULL,
    role      TEXT   NOT NULL CHECK (role IN ('prefill', 'decode')),
    -- Who last used the namespace on that worker (may be unknown).
    tenant    TEXT,
    pages     BIGINT NOT NULL CHECK (pages >= 0),
    at        BIGINT NOT NULL,
    PRIMARY KEY (node, namespace)
);
