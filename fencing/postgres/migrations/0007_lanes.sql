-- 0007: key-ordered lanes (`fencectl run --lanes N`). `completions`: the spans of offsets a
-- lane's transaction applied above the partition's frontier, written in the same
-- transaction as its effects under the partition's epoch (first[i]..last[i], both included;
-- a span also covers the offsets Kafka never delivered just below its record). The frontier
-- a successor resumes from is the partition row's frontier extended by the contiguous spans
-- above it; it skips every record inside a span. A fold moves the contiguous prefix into the
-- partition row and deletes the rows wholly below it.
CREATE TABLE completions (
    id        bigserial   PRIMARY KEY,
    group_id  text        NOT NULL,
    topic     text        NOT NULL,
    partition integer     NOT NULL,
    epoch     bigint      NOT NULL,
    first     bigint[]    NOT NULL,
    last      bigint[]    NOT NULL CHECK (cardinality(last) = cardinality(first)
                                          AND cardinality(first) > 0),
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX completions_partition_idx ON completions (group_id, topic, partition);
