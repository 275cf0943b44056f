-- 0005: handler failures that blame the right record.
-- `attempts.alone`: attempts of the record with nothing else of its process in flight, each
-- counted before it starts; only these count process deaths against the record (`attempts`
-- also counts transient retries of a batch starting at the offset). `alone_epoch`: the epoch
-- of the last one; when the lifetime that claimed it ended cleanly (release or retire), that
-- attempt was no death and the next one replaces it instead of adding to it.
-- `intents`: one row per partition, written in its own committed transaction before an
-- outcome-uncertain handler runs a batch: the frontier the batch starts at and its last
-- offset. An intent whose first_offset is still the durable frontier was never followed by a
-- commit: its records' outcome is unknown and they are never run again.
ALTER TABLE attempts ADD COLUMN alone integer NOT NULL DEFAULT 0 CHECK (alone >= 0),
                     ADD COLUMN alone_epoch bigint;

CREATE TABLE intents (
    group_id     text        NOT NULL,
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    first_offset bigint      NOT NULL,
    last_offset  bigint      NOT NULL CHECK (last_offset >= first_offset),
    epoch        bigint      NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);
