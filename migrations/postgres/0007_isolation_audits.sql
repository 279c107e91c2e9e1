-- Issue 37 (PostgreSQL): the side-channel audit's verdicts, one row per worker and channel of
-- each probe run: what the auditor's isolation chart draws. p-values are stored as
-- round(-log10(p) * 1000) (the schema holds only integers and text on both backends): 0 is
-- p = 1, 3000 is p = 10^-3.

CREATE TABLE isolation_audits (
    id                          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id                      BIGINT NOT NULL REFERENCES probe_runs (id),
    -- The prefill worker whose cache the rounds were computed against ('all' when the
    -- deployment signs no receipts, so the auditor cannot tell).
    worker                      TEXT   NOT NULL,
    -- 'timing': first-token times (Kolmogorov-Smirnov); 'order': the order of a mixed batch
    -- (exact rank test).
    channel                     TEXT   NOT NULL CHECK (channel IN ('timing', 'order')),
    rounds                      BIGINT NOT NULL CHECK (rounds >= 0),
    p_neg_log10_milli           BIGINT NOT NULL CHECK (p_neg_log10_milli >= 0),
    -- The timing channel's positive control (warm against cold); NULL for 'order'.
    control_p_neg_log10_milli   BIGINT CHECK (control_p_neg_log10_milli >= 0),
    threshold_p_neg_log10_milli BIGINT NOT NULL CHECK (threshold_p_neg_log10_milli >= 0),
    conclusive                  BIGINT NOT NULL CHECK (conclusive IN (0, 1)),
    leak                        BIGINT NOT NULL CHECK (leak IN (0, 1)),
    at                          BIGINT NOT NULL
);
CREATE INDEX isolation_audits_at ON isolation_audits (at);
