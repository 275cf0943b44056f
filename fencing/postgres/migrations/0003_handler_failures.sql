-- 0003: handler failures. Durable attempt counts per failing offset (they survive
-- rebalances, restarts and process deaths) and the poison details of quarantined records.
CREATE TABLE attempts (
    group_id      text        NOT NULL,
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    "offset"      bigint      NOT NULL,
    attempts      integer     NOT NULL CHECK (attempts >= 0),
    max_attempts  integer     NOT NULL,
    last_error    text,
    next_retry_at timestamptz,
    epoch         bigint      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition, "offset")
);

ALTER TABLE quarantine ADD COLUMN error_type text;
ALTER TABLE quarantine ADD COLUMN error_message text;
ALTER TABLE quarantine ADD COLUMN traceback_digest text;
