-- 0001: partition rows (the fence), ownership journal, members, quarantine.
-- Applied by `fencectl migrate` with search_path set to the target schema only:
-- every name below is created in that schema.

CREATE TABLE partitions (
    group_id   text        NOT NULL,
    topic      text        NOT NULL,
    partition  integer     NOT NULL CHECK (partition >= 0),
    epoch      bigint      NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    frontier   bigint      NOT NULL CHECK (frontier >= 0),
    owner      text,
    topic_id   text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);

CREATE TABLE journal (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_id  text        NOT NULL,
    topic     text        NOT NULL,
    partition integer     NOT NULL,
    event     text        NOT NULL
              CHECK (event IN ('claim', 'fence', 'retire', 'release', 'gap-skip', 'reset', 'adopt')),
    epoch     bigint,
    lifetime  text,
    detail    text        NOT NULL DEFAULT '',
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX journal_partition_idx ON journal (group_id, topic, partition, id);

-- The journal is append-only: operators read it, nothing decides from it.
CREATE FUNCTION journal_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ownership journal is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER journal_append_only BEFORE UPDATE OR DELETE ON journal
    FOR EACH STATEMENT EXECUTE FUNCTION journal_append_only();

CREATE TABLE members (
    lifetime_id text        PRIMARY KEY,
    group_id    text        NOT NULL,
    member_id   text,
    host        text        NOT NULL DEFAULT '',
    pid         integer,
    state       text        NOT NULL DEFAULT 'starting',
    detail      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX members_group_idx ON members (group_id, last_seen);

CREATE TABLE quarantine (
    group_id  text        NOT NULL,
    topic     text        NOT NULL,
    partition integer     NOT NULL,
    "offset"  bigint      NOT NULL,
    key       bytea,
    value     bytea,
    headers   jsonb       NOT NULL DEFAULT '[]'::jsonb,
    reason    text        NOT NULL,
    epoch     bigint      NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition, "offset")
);
