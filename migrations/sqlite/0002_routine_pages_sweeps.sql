-- Issue 19 (SQLite): routine integrity events are counted instead of opening incidents; page
-- tags are columns of incidents (filterable, linking incidents on one page); probe runs say
-- which sweep they were.

-- 1 when the event was routine (see IntegrityKind::is_routine) and so opened no incident.
ALTER TABLE integrity_events ADD COLUMN routine INTEGER NOT NULL DEFAULT 0
    CHECK (routine IN (0, 1));
CREATE INDEX integrity_events_routine ON integrity_events (routine, kind);

-- The (page, generation) an incident concerns, on its node.
ALTER TABLE incidents ADD COLUMN page INTEGER;
ALTER TABLE incidents ADD COLUMN generation INTEGER;
CREATE INDEX incidents_page ON incidents (node, page);
-- Incidents opened before this migration kept their page tag in the details JSON only.
UPDATE incidents
   SET page = json_extract(details, '$.page'),
       generation = json_extract(details, '$.generation')
 WHERE json_valid(details) AND json_extract(details, '$.source') = 'integrity_event';

ALTER TABLE probe_runs ADD COLUMN sweep TEXT NOT NULL DEFAULT 'full'
    CHECK (sweep IN ('light', 'full'));
