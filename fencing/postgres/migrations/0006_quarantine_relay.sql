-- 0006: the quarantine relayed to a dead-letter topic (`fencectl quarantine relay`).
-- `record_timestamp_ms`: the record's Kafka timestamp (NULL for rows quarantined before this
-- migration, and for records without one); `attempts`: the attempts the worker counted for
-- the record when it quarantined it (1: rejected at its first try). `relayed_*`: where the
-- relay published the row (topic, partition, offset) and when the broker acknowledged it;
-- NULL until then. A row quarantined again (after a reset re-ran its offset) is a new
-- quarantine: its relayed_* are cleared, so it is relayed again (with a new dedupe id).
ALTER TABLE quarantine
    ADD COLUMN record_timestamp_ms bigint,
    ADD COLUMN attempts            integer CHECK (attempts >= 0),
    ADD COLUMN relayed_at          timestamptz,
    ADD COLUMN relayed_to          text,
    ADD COLUMN relayed_partition   integer,
    ADD COLUMN relayed_offset      bigint;
CREATE INDEX quarantine_unrelayed_idx ON quarantine (group_id, at)
    WHERE relayed_at IS NULL AND state = 'quarantined';
