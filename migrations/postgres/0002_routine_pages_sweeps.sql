-- Issue 19 (PostgreSQL): routine integrity events are counted instead of opening incidents;
-- page tags are columns of incidents (filterable, linking incidents on one page); probe runs
-- say which sweep they were.

-- 1 when the event was routine (see IntegrityKind::is_routine) and so opened no incident.
ALTER TABLE integrity_events ADD COLUMN routine BIGINT NOT NULL DEFAULT 0
    CHECK (routine IN (0, 1));
CREATE INDEX integrity_events_routine ON integrity_events (routine, kind);

-- The (page, generation) an incident concerns, on its node.
ALTER TABLE incidents ADD COLUMN page BIGINT;
ALTER TABLE incidents ADD COLUMN generation BIGINT;
CREATE INDEX incidents_page ON incidents (node, page);
-- Incidents opened before this migration kept their page tag in the details JSON only (written
-- by serde_json, compact: `"page":12`). A pattern, not a JSON cast, so no row can fail it.
UPDATE incidents
   SET page = CAST(substring(details from '"page":([0-9]{1,18})[,}]') AS BIGINT),
       generation = CAST(substring(details from '"generation":([0-9]{1,18})[,}]') AS BIGINT)
 WHERE details LIKE '%"source":"integrity_event"%';

ALTER TABLE probe_runs ADD COLUMN sweep TEXT NOT NULL DEFAULT 'full'
    CHECK (sweep IN ('light', 'full'));
