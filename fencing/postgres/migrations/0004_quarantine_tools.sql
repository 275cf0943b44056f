-- 0004: quarantine tools (`fencectl quarantine list|show|replay|purge`).
-- A quarantine row is `quarantined` until a replay applies it through the handler; then it is
-- `replayed` (kept, with who/when/result, until `purge --before`). A replay that fails again
-- leaves it `quarantined` with the new reason and counts the attempt in `replays`.
-- Independent of 0003's content: it only adds columns, and extends the journal's event CHECK
-- from whatever list it holds now (read from the catalog), so events another migration added
-- are kept.
ALTER TABLE quarantine
    ADD COLUMN state         text        NOT NULL DEFAULT 'quarantined'
                                         CHECK (state IN ('quarantined', 'replayed')),
    ADD COLUMN replays       integer     NOT NULL DEFAULT 0 CHECK (replays >= 0),
    ADD COLUMN replayed_by   text,
    ADD COLUMN replayed_at   timestamptz,
    ADD COLUMN replay_result text;
CREATE INDEX quarantine_handled_idx ON quarantine (group_id, replayed_at)
    WHERE state = 'replayed';

DO $$
DECLARE
    con    record;
    events text[];
BEGIN
    SELECT c.conname, pg_get_constraintdef(c.oid) AS def INTO con
    FROM pg_constraint c
    WHERE c.conrelid = 'journal'::regclass AND c.contype = 'c'
      AND pg_get_constraintdef(c.oid) LIKE '%event%';
    IF con.conname IS NULL THEN
        RAISE EXCEPTION 'journal has no CHECK constraint on event';
    END IF;
    SELECT array_agg(DISTINCT m[1]) INTO events
    FROM regexp_matches(con.def, '''([^'']+)''', 'g') AS m;
    EXECUTE format('ALTER TABLE journal DROP CONSTRAINT %I', con.conname);
    EXECUTE format('ALTER TABLE journal ADD CONSTRAINT journal_event_check CHECK (event = ANY (%L::text[]))',
                   (SELECT array_agg(DISTINCT e ORDER BY e)
                    FROM unnest(events || ARRAY['replay', 'purge']) AS e));
END;
$$;
