"""The PostgreSQL fence store's statements, built once per schema (all parameterized).

Rules
- Every statement names its tables schema-qualified, so a handler's own tables keep the
  connection's search_path.
- ``claim``, ``observe`` (which ``validate`` also uses) and ``journal`` take arrays
  (unnest): one round trip for a whole assignment. ``claim`` creates missing rows at
  epoch 1 (= 0 + 1), raises existing epochs by one, sets the owner, and journals every
  claim in the same statement.
- ``begin_fence`` is the fence: ``BEGIN`` and one UPDATE in a single simple-protocol
  message (one round trip): it takes the partition row lock, requires epoch and frontier,
  and moves the frontier to the batch end as the transaction's first statement, so a
  concurrent claim waits for COMMIT (or ROLLBACK) and then sees its result. Its status is
  ``UPDATE 0`` when the token no longer matches. The simple protocol takes no parameters:
  the message carries only integers (row id, epoch, frontiers) formatted with ``:d`` from
  ``int`` values, never text, so nothing can be injected. Connections of the store's own
  pool run ``prepare_fence`` once, so the message is ``BEGIN; EXECUTE fence_advance(...)``
  (no parse or plan per batch).
- Lanes: ``lane_fence`` checks the epoch under a share lock (lanes of a partition run side
  by side; a claim waits for them all, then fences them); ``lane_done`` writes a lane
  transaction's spans; ``completions`` reads each partition's row with its spans (one
  read for a set; ``completions_settled`` waits for a COMMIT in progress like
  ``observe_settled``); ``fold`` moves the frontier under the token and deletes the spans
  wholly below it and the attempt counts below it (a lane's transaction leaves them: a
  delete of another lane's counts would lose their marks).
"""

from __future__ import annotations

from dataclasses import dataclass

from fencing.postgres.schema import quote_schema

__all__ = ["FENCE_STATEMENT", "Statements"]

#: name of the per-session prepared fence statement (see ``prepare_fence``)
FENCE_STATEMENT = "fence_advance"


@dataclass(frozen=True, slots=True)
class Statements:
    claim: str
    observe: str
    observe_settled: str
    begin_fence: str
    prepare_fence: str
    begin_fence_prepared: str
    read_one: str
    end_blockers: str
    quarantine: str
    skip: str
    journal: str
    heartbeat: str
    record_attempt: str
    clear_attempts: str
    attempts: str
    operator_reset: str
    record_intent: str
    lane_fence: str
    begin_lane_fence: str
    lane_done: str
    completions: str
    completions_settled: str
    fold: str

    @classmethod
    def for_schema(cls, schema: str) -> Statements:
        s = quote_schema(schema)
        # the last attempt alone (of the attempts row ``a``) was no death: its lifetime
        # journaled a release or retire after its claim
        clean_end = f"""EXISTS (
            SELECT 1 FROM {s}.journal c
            WHERE c.group_id = $1 AND c.topic = $2 AND c.partition = $3 AND c.event = 'claim'
              AND c.epoch = a.alone_epoch AND EXISTS (
                  SELECT 1 FROM {s}.journal x
                  WHERE x.group_id = $1 AND x.topic = $2 AND x.partition = $3
                    AND x.lifetime = c.lifetime AND x.id > c.id
                    AND x.event IN ('release', 'retire')))"""
        observe = f"""
SELECT p.topic, p.partition, p.epoch, p.frontier, p.topic_id, p.id
FROM unnest($2::text[], $3::int[]) AS r(topic, partition)
JOIN {s}.partitions p ON p.group_id = $1 AND p.topic = r.topic AND p.partition = r.partition"""
        return cls(
            claim=f"""
WITH req AS (
    SELECT * FROM unnest($2::text[], $3::int[], $4::bigint[], $5::text[])
        AS r(topic, partition, initial_frontier, topic_id)
), up AS (
    INSERT INTO {s}.partitions AS p (group_id, topic, partition, epoch, frontier, owner, topic_id)
    SELECT $1, topic, partition, 1, initial_frontier, $6, topic_id FROM req
    ORDER BY topic, partition
    ON CONFLICT (group_id, topic, partition) DO UPDATE
        SET epoch = p.epoch + 1, owner = EXCLUDED.owner,
            topic_id = coalesce(p.topic_id, EXCLUDED.topic_id), updated_at = now()
    RETURNING p.topic, p.partition, p.epoch, p.frontier, p.id
), j AS (
    INSERT INTO {s}.journal (group_id, topic, partition, event, epoch, lifetime, detail)
    SELECT $1, topic, partition, 'claim', epoch, $6, 'frontier=' || frontier FROM up
)
SELECT topic, partition, epoch, frontier, id FROM up""",
            observe=observe,
            observe_settled=observe + "\nFOR SHARE OF p",  # waits for a COMMIT in progress
            begin_fence=(
                f"BEGIN; UPDATE {s}.partitions SET frontier = {{end:d}}, updated_at = now()"
                " WHERE id = {row_id:d} AND epoch = {epoch:d} AND frontier = {frontier:d}"),
            prepare_fence=(
                f"PREPARE {FENCE_STATEMENT} (bigint, bigint, bigint, bigint) AS UPDATE"
                f" {s}.partitions SET frontier = $1, updated_at = now()"
                " WHERE id = $2 AND epoch = $3 AND frontier = $4"),
            begin_fence_prepared=(
                f"BEGIN; EXECUTE {FENCE_STATEMENT}({{end:d}}, {{row_id:d}}, {{epoch:d}},"
                " {frontier:d})"),
            end_blockers="""
SELECT a.pid, a.state, a.wait_event, a.xact_start, pg_terminate_backend(a.pid) AS ended
FROM pg_stat_activity a
WHERE a.pid = ANY(pg_blocking_pids($1)) AND a.application_name = $2
  AND a.datname = current_database()""",
            read_one=f"""
SELECT id, epoch, frontier FROM {s}.partitions
WHERE group_id = $1 AND topic = $2 AND partition = $3""",
            quarantine=f"""
INSERT INTO {s}.quarantine AS q
    (group_id, topic, partition, "offset", key, value, headers, reason, epoch,
     error_type, error_message, traceback_digest, record_timestamp_ms, attempts)
SELECT $1, $2, $3, o, k, v, h::jsonb, r, $4, et, em, td, ts,
       greatest(1, (SELECT a.attempts FROM {s}.attempts a WHERE a.group_id = $1
                    AND a.topic = $2 AND a.partition = $3 AND a."offset" = o))
FROM unnest($5::bigint[], $6::bytea[], $7::bytea[], $8::text[], $9::text[], $10::text[],
            $11::text[], $12::text[], $13::bigint[]) AS t(o, k, v, h, r, et, em, td, ts)
ON CONFLICT (group_id, topic, partition, "offset") DO UPDATE
    SET key = EXCLUDED.key, value = EXCLUDED.value, headers = EXCLUDED.headers,
        reason = EXCLUDED.reason, epoch = EXCLUDED.epoch, at = now(),
        state = 'quarantined',
        error_type = EXCLUDED.error_type, error_message = EXCLUDED.error_message,
        traceback_digest = EXCLUDED.traceback_digest,
        record_timestamp_ms = EXCLUDED.record_timestamp_ms, attempts = EXCLUDED.attempts,
        relayed_at = NULL, relayed_to = NULL, relayed_partition = NULL,
        relayed_offset = NULL""",
            skip=f"""
WITH upd AS (
    UPDATE {s}.partitions SET frontier = $6, updated_at = now()
    WHERE group_id = $1 AND topic = $2 AND partition = $3 AND epoch = $4 AND frontier = $5
    RETURNING epoch, frontier, owner
), j AS (
    INSERT INTO {s}.journal (group_id, topic, partition, event, epoch, lifetime, detail)
    SELECT $1, $2, $3, 'gap-skip', epoch, owner, $7 FROM upd
)
SELECT epoch, frontier FROM upd""",
            journal=f"""
INSERT INTO {s}.journal (group_id, topic, partition, event, epoch, lifetime, detail)
SELECT $1, topic, partition, $4, $5, $6, $7
FROM unnest($2::text[], $3::int[]) AS r(topic, partition)""",
            # the upsert runs whether or not the SELECT reads it (a data-modifying WITH)
            heartbeat=f"""
WITH beat AS (
    INSERT INTO {s}.members AS m (lifetime_id, group_id, member_id, host, pid, state, detail)
    VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)
    ON CONFLICT (lifetime_id) DO UPDATE
        SET member_id = coalesce(EXCLUDED.member_id, m.member_id), host = EXCLUDED.host,
            pid = EXCLUDED.pid, state = EXCLUDED.state, detail = EXCLUDED.detail,
            last_seen = now()
)
SELECT p.topic, p.partition FROM {s}.partitions p
WHERE p.group_id = $2 AND starts_with(p.owner, $8)""",
            # every claim is journaled by the claim statement itself: no claim above the
            # epoch means only operators installed the epochs above it
            operator_reset=f"""
SELECT starts_with(p.owner, $5) AND p.epoch > $4 AND NOT EXISTS (
    SELECT 1 FROM {s}.journal j
    WHERE j.group_id = $1 AND j.topic = $2 AND j.partition = $3 AND j.event = 'claim'
      AND j.epoch > $4) AS reset
FROM {s}.partitions p WHERE p.group_id = $1 AND p.topic = $2 AND p.partition = $3""",
            # FOR SHARE: a concurrent claim is waited for and then fences this write
            record_attempt=f"""
WITH p AS (
    SELECT 1 FROM {s}.partitions
    WHERE group_id = $1 AND topic = $2 AND partition = $3 AND epoch = $4 AND frontier = $5
    FOR SHARE
)
INSERT INTO {s}.attempts AS a (group_id, topic, partition, "offset", attempts, alone,
                               alone_epoch, max_attempts, last_error, next_retry_at, epoch)
SELECT $1, $2, $3, $6, $10, $11, CASE WHEN $11 = 1 THEN $4 END, $7, $8,
       now() + make_interval(secs => $9), $4 FROM p
ON CONFLICT (group_id, topic, partition, "offset") DO UPDATE
    SET attempts = CASE WHEN EXCLUDED.alone = 1 AND (a.next_retry_at IS NOT NULL
                                                     OR {clean_end})
                        -- this attempt alone is the retry counted already, or it replaces
                        -- the last one, which a clean end of its lifetime interrupted
                        THEN a.attempts
                        ELSE greatest(a.attempts + 1, EXCLUDED.attempts) END,
        alone = a.alone + EXCLUDED.alone - CASE WHEN EXCLUDED.alone = 1 AND {clean_end}
                                                THEN 1 ELSE 0 END,
        alone_epoch = CASE WHEN EXCLUDED.alone = 1 THEN EXCLUDED.epoch ELSE a.alone_epoch END,
        max_attempts = EXCLUDED.max_attempts,
        last_error = coalesce(EXCLUDED.last_error, a.last_error),
        next_retry_at = EXCLUDED.next_retry_at, epoch = EXCLUDED.epoch, updated_at = now()
RETURNING a.attempts, a.alone, a.last_error""",
            # FOR SHARE as above; one row per partition, overwritten by the next batch's
            record_intent=f"""
WITH p AS (
    SELECT 1 FROM {s}.partitions
    WHERE group_id = $1 AND topic = $2 AND partition = $3 AND epoch = $4 AND frontier = $5
    FOR SHARE
)
INSERT INTO {s}.intents AS i (group_id, topic, partition, first_offset, last_offset, epoch)
SELECT $1, $2, $3, $5, $6, $4 FROM p
ON CONFLICT (group_id, topic, partition) DO UPDATE
    SET first_offset = EXCLUDED.first_offset, last_offset = EXCLUDED.last_offset,
        epoch = EXCLUDED.epoch, at = now()
RETURNING i.first_offset""",
            # a lane's fence: the epoch under a share lock, so lanes of one partition run
            # side by side while a claim (an UPDATE) waits for every one of them
            lane_fence=f"""
SELECT 1 FROM {s}.partitions WHERE id = $1 AND epoch = $2 FOR SHARE""",
            begin_lane_fence=(
                f"BEGIN; SELECT 1 FROM {s}.partitions WHERE id = {{row_id:d}}"
                " AND epoch = {epoch:d} FOR SHARE"),
            lane_done=f"""
INSERT INTO {s}.completions (group_id, topic, partition, epoch, first, last)
VALUES ($1, $2, $3, $4, $5::bigint[], $6::bigint[])""",
            completions=f"""
SELECT p.topic, p.partition, p.epoch, p.frontier, c.first, c.last
FROM unnest($2::text[], $3::int[]) AS r(topic, partition)
JOIN {s}.partitions p ON p.group_id = $1 AND p.topic = r.topic AND p.partition = r.partition
LEFT JOIN {s}.completions c ON c.group_id = $1 AND c.topic = r.topic
    AND c.partition = r.partition""",
            completions_settled=f"""
SELECT p.topic, p.partition, p.epoch, p.frontier, c.first, c.last
FROM unnest($2::text[], $3::int[]) AS r(topic, partition)
JOIN {s}.partitions p ON p.group_id = $1 AND p.topic = r.topic AND p.partition = r.partition
LEFT JOIN {s}.completions c ON c.group_id = $1 AND c.topic = r.topic
    AND c.partition = r.partition
FOR SHARE OF p""",
            # the contiguous prefix into the row; rows wholly below it deleted
            fold=f"""
WITH upd AS (
    UPDATE {s}.partitions SET frontier = $6, updated_at = now()
    WHERE group_id = $1 AND topic = $2 AND partition = $3 AND epoch = $4 AND frontier = $5
    RETURNING epoch, frontier
), del AS (
    DELETE FROM {s}.completions c USING upd
    WHERE c.group_id = $1 AND c.topic = $2 AND c.partition = $3
      AND (SELECT max(l) FROM unnest(c.last) AS l) < upd.frontier
), att AS (
    DELETE FROM {s}.attempts a USING upd
    WHERE a.group_id = $1 AND a.topic = $2 AND a.partition = $3 AND a."offset" < upd.frontier
)
SELECT epoch, frontier FROM upd""",
            clear_attempts=f"""
DELETE FROM {s}.attempts WHERE group_id = $1 AND topic = $2 AND partition = $3
    AND "offset" < $4""",
            # unclean: the lifetime that claimed the previous epoch journaled no release or
            # retire for the partition after that claim (it died, or lost it silently), or
            # one saying the partition's suspect window was still open ($6); uncertain_to:
            # the last offset of an intent that starts at the frontier (never committed)
            attempts=f"""
SELECT r.topic, r.partition, coalesce(a.attempts, 0) AS attempts, a.last_error,
    coalesce(a.alone, 0) AS alone, i.last_offset AS uncertain_to,
    EXISTS (
        SELECT 1 FROM {s}.journal c
        WHERE c.group_id = $1 AND c.topic = r.topic AND c.partition = r.partition
          AND c.event = 'claim' AND c.epoch = r.epoch - 1
          AND NOT EXISTS (
              SELECT 1 FROM {s}.journal x
              WHERE x.group_id = $1 AND x.topic = r.topic AND x.partition = r.partition
                AND x.lifetime = c.lifetime AND x.id > c.id
                AND x.event IN ('release', 'retire')
                AND left(coalesce(x.detail, ''), length($6)) <> $6)) AS unclean
FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bigint[]) AS r(topic, partition, epoch,
                                                                   frontier)
LEFT JOIN {s}.attempts a ON a.group_id = $1 AND a.topic = r.topic
    AND a.partition = r.partition AND a."offset" = r.frontier
LEFT JOIN {s}.intents i ON i.group_id = $1 AND i.topic = r.topic
    AND i.partition = r.partition AND i.first_offset = r.frontier""",
        )
