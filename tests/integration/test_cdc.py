"""A PostgreSQL table replicated through a real Debezium into another, exactly: the source
(the database ``source`` of the local stack's PostgreSQL, ``wal_level=logical``) is read by
Debezium's PostgreSQL connector in Kafka Connect (``fencectl stack up --with debezium``),
its change events go through Kafka, and ``fencectl run --sink ... --sink-envelope debezium
--sink-truncate`` members write the target table in the fence's transactions, with the
version guard (``--sink-version-column lsn --sink-version-from source.lsn``) and without.
After inserts, updates of every column type, deletes, primary-key changes and a truncate
— with a sink member SIGKILLed, a zombie (SIGSTOP), COMMIT replies lost, Kafka Connect
killed and restarted (which delivers events again: the version guard applies an event of
the same position again), the Kafka broker SIGKILLed while the source changes and started
again, and the PostgreSQL server crashed (an immediate shutdown, recovery on restart; it
holds the source and the target) — the target equals the source row by row, value by
value.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from typing import Any

import asyncpg
import pytest

from fencing.testing.pgproxy import Action
from ops.stack.connect import avro_converter_config
from ops.stack.connectors import postgres_connector, restart_failed
from tests.integration.cdc import (
    COLUMNS,
    MOOD_DDL,
    PREFIX,
    SOURCE_DDL,
    TARGET_DDL,
    after_truncate,
    clean_leftovers,
    delete_connector,
    drop_slot,
    register_connector,
    rows,
    workload,
)
from tests.integration.pg_helpers import execute
from tests.integration.sink_support import fetch
from tests.integration.workers import (
    GROUP_SETUPS,
    ProxyThread,
    WorkerProc,
    fresh_schema,
    stop_live,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.exclusive]  # kills and restarts Connect


def _converged(dsn: str, target: str, source_dsn: str, table: str, *,
               tick: Any = lambda: None) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The target's and the source's rows once equal, or after 240 s (then they differ);
    ``tick`` runs at each look."""
    want = asyncio.run(rows(source_dsn, table))

    def replicated() -> bool:
        tick()
        return asyncio.run(rows(dsn, target)) == want

    try:
        wait_until(replicated, timeout_s=240, interval_s=2.0,
                   what="the target equal to the source")
    except AssertionError:
        pass  # the caller's comparison says how they differ
    return asyncio.run(rows(dsn, target)), want


async def _versions(dsn: str, target: str) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return [r[0] for r in await conn.fetch(f"SELECT lsn FROM {target}")]
    finally:
        await conn.close()


def _difference(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> str:
    """The ids only one side has and the first rows that differ, column by column."""
    by_got, by_want = {r[0]: r for r in got}, {r[0]: r for r in want}
    lines = [f"only in the target: {sorted(set(by_got) - set(by_want))[:20]}",
             f"only in the source: {sorted(set(by_want) - set(by_got))[:20]}"]
    names = [c for c, _ in COLUMNS]
    for key in sorted(set(by_got) & set(by_want)):
        if by_got[key] != by_want[key]:
            lines.append(f"id {key}: " + "; ".join(
                f"{n}: target {g!r} source {w!r}" for n, g, w in
                zip(names, by_got[key], by_want[key], strict=True) if g != w))
        if len(lines) > 12:
            break
    return "\n".join(lines)


def _source_and_target(debezium: Any, services: Any, name: str
                       ) -> tuple[str, str, str, str, str]:
    """A fresh source table ``NAME_xxxxxx`` of every type holding ``workload``'s first rows
    (what Debezium's snapshot reads), its empty target in a fresh fence schema, and the
    connector's prefix and topic (leftovers of an interrupted run removed first): (table,
    prefix, topic, schema, target)."""
    clean_leftovers(debezium.connect_url, debezium.source_dsn)
    table = f"{name}_{uuid.uuid4().hex[:6]}"
    prefix = f"{PREFIX}{uuid.uuid4().hex[:6]}"
    asyncio.run(execute(debezium.source_dsn, MOOD_DDL, f"CREATE TABLE {table} {SOURCE_DDL}",
                         workload(table)[0]))
    schema = asyncio.run(fresh_schema(services.dsn))
    target = f'"{schema}".{table}'
    asyncio.run(execute(services.dsn, MOOD_DDL, f"CREATE TABLE {target} {TARGET_DDL}"))
    return table, prefix, f"{prefix}.public.{table}", schema, target


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
@pytest.mark.parametrize(("converter", "guarded"), [
    # make test runs the JSON converter unguarded and Avro guarded (each ~70 s alone on the
    # machine); make test-cdc the JSON converter guarded too
    pytest.param("json", True, marks=pytest.mark.full_only), ("json", False), ("avro", True)],
    ids=["json-guarded", "json-unguarded", "avro-guarded"])
def test_a_table_replicated_through_debezium_equals_its_source(
        debezium: Any, services: Any, setup: Any, converter: str, guarded: bool) -> None:
    """A source table replicated through a real Debezium equals its source, row by row and
    type by type, after kills, a zombie, lost COMMIT replies, a Connect restart, the Kafka
    broker lost, a PostgreSQL crash and a truncate. ``converter``: Kafka Connect's JSON
    converter with schemas (the stack's default), or Apicurio's Avro converter through the
    stack's registry (keys and values; the sink reads them with ``--sink-format avro
    --sink-key-format avro``).
    ``guarded``: with the version guard from ``source.lsn``; without it the sink reads the
    JSON events past their ``source`` block (``debezium.JsonEvents``' skim), and Connect's
    re-delivered events are applied again in their partition's order, which ends in the
    same rows: a key's events are all in one partition, the re-delivered ones after the
    originals, the last of them the newest."""
    source_dsn, connect_url = debezium.source_dsn, debezium.connect_url
    table, prefix, topic, schema, target = _source_and_target(debezium, services, "items")
    group = f"g{prefix}"
    config = postgres_connector(source_dsn, prefix, table)
    formats: tuple[str, ...] = ("--sink-key-format", "json")
    if converter == "avro":
        config |= avro_converter_config(services.schema_registry_url)
        formats = ("--sink-format", "avro", "--sink-key-format", "avro")
    register_connector(connect_url, prefix, config)
    guard = ("--sink-version-column", "lsn", "--sink-version-from", "source.lsn")
    argv = ("--sink", f"table={schema}.{table}", "--sink-envelope", "debezium", *formats,
            "--sink-truncate", *(guard if guarded else ()))
    members: list[WorkerProc] = []
    spawned: dict[WorkerProc, tuple[str, dict[str, str] | None]] = {}
    proxy = ProxyThread(services.dsn)
    try:
        wait_until(lambda: topic in debezium.topics(), timeout_s=120,
                   what="Debezium's topic of the table")

        def member(name: str, env: dict[str, str] | None = None) -> WorkerProc:
            proc = WorkerProc(topic=topic, group=group, schema=schema, setup=setup,
                              extra=argv, name=name, env={
                                  "SCHEMA_REGISTRY_URL": services.schema_registry_url,
                                  **(env or {})})
            spawned[proc] = (name, env)
            return proc

        members.append(member("a", {"FENCE_DSN": proxy.dsn}))
        members.append(member("b"))
        wait_until(lambda: all("assigned {" in m.log() for m in members), timeout_s=60,
                   what="both members assigned")
        lost = []
        for action, statement in zip((Action.CUT_AFTER, Action.CUT_BEFORE),
                                     workload(table)[1:3], strict=True):
            rule = proxy.add_rule("COMMIT", action, times=1)     # a COMMIT reply lost
            asyncio.run(execute(source_dsn, statement))
            wait_until(lambda rule=rule: rule.count >= 1,  # type: ignore[misc]
                       timeout_s=60, what=f"{action} fired")
            lost.append(action)
        killed = members[1]
        killed.kill()                                            # a member crashes
        debezium.restart()                                       # Connect delivers again
        members.append(member("c"))
        wait_until(lambda: "assigned {" in members[2].log(), timeout_s=60,
                   what="the third member assigned")
        zombie = members[2]
        zombie.signal(signal.SIGSTOP)                            # a zombie
        statements = workload(table)[3:]
        for statement in statements[:-1]:
            asyncio.run(execute(source_dsn, statement))
        time.sleep(8)
        zombie.signal(signal.SIGCONT)
        debezium.crash_kafka(while_down=lambda: asyncio.run(execute(  # the broker lost
            source_dsn, f"UPDATE {table} SET name = name || ' v3' WHERE id % 4 = 0")))
        debezium.crash_postgres()                                # source and target crash
        asyncio.run(execute(source_dsn, statements[-1]))
        exits: list[int] = []
        ended: list[str] = []  # the log's last lines of each member that exited, for a failure
        fenced: list[str] = []
        source_restarts: list[float] = []

        def supervise() -> None:
            """Restart a member that exited 5 (a service unavailable past its bound) or 3
            (retired: the zombie, fenced once a newer owner claimed its partition while it
            was stopped), as its supervisor does (docs/operations.md); and Debezium's task
            if it failed (it fails when it starts while PostgreSQL is shutting down, as after
            Kafka came back and PostgreSQL crashed: ``restart_failed``), as an operator does."""
            if restart_failed(connect_url, prefix):
                source_restarts.append(time.monotonic())
            for m in [m for m in members if not m.alive() and m is not killed]:
                members.remove(m)
                code = m.wait(5)
                if code == 3 and m is zombie:
                    fenced.append(m.log())
                else:
                    exits.append(code)
                if code in (3, 5):
                    name, env = spawned[m]
                    members.append(member(name + "'", env))

        got, want = _converged(services.dsn, target, source_dsn, table, tick=supervise)
        assert set(exits) <= {5}, (f"a member ended with {exits} after the crash, not 5:\n"
                                   + "\n".join(ended))
        assert all("lifetime ends (exit 3, Fenced)" in log for log in fenced), fenced
        assert got == want, _difference(got, want) + (
            f"\nDebezium's failed task restarted {len(source_restarts)} times")
        assert len(lost) == 2
        ids = [r[0] for r in got]
        assert 1 not in ids and 2 not in ids and {1001, 1002} <= set(ids), ids
        # a truncate is ordered with its own partition's events only: the rows written
        # after it follow once it is applied (docs/table-sink.md)
        asyncio.run(execute(source_dsn, f"TRUNCATE {table}"))
        def truncated() -> bool:
            supervise()
            return not asyncio.run(rows(services.dsn, target))

        wait_until(truncated, timeout_s=120, interval_s=1.0,
                   what="the truncate applied to the target")
        asyncio.run(execute(source_dsn, after_truncate(table)))
        got, want = _converged(services.dsn, target, source_dsn, table, tick=supervise)
        assert got == want and len(got) == 20, _difference(got, want)
        versions = asyncio.run(_versions(services.dsn, target))
        if guarded:
            assert all(v is not None for v in versions), "a row without its source position"
        else:
            assert not any(versions), "an unguarded sink wrote a version"
    finally:
        stop_live([m for m in members if m.alive()])
        for m in members:
            m.ensure_dead()
        proxy.close()
        delete_connector(connect_url, prefix)
        asyncio.run(drop_slot(source_dsn, f"{prefix}_slot"))



async def _expected(dsn: str, table: str, casts: dict[str, str]) -> list[tuple[Any, ...]]:
    """The source's rows as ``rows`` reads them, a column cast where Debezium's mode keeps
    less than PostgreSQL does (``casts``: column -> type)."""
    conn = await asyncpg.connect(dsn)
    try:
        cols = ", ".join(f"{c}::{casts[c]}" if c in casts else c for c, _ in COLUMNS)
        return [tuple(r) for r in await conn.fetch(f"SELECT {cols} FROM {table} ORDER BY id")]
    finally:
        await conn.close()


@pytest.mark.parametrize(("decimals", "times"), [("string", "connect"),
                                                  ("double", "adaptive")])
def test_debeziums_decimal_and_time_modes_replicate_as_they_are_sent(
        debezium: Any, services: Any, decimals: str, times: str) -> None:
    """The connector's ``decimal.handling.mode`` (string: numerics as text; double: as
    JSON numbers) and ``time.precision.mode`` (connect: Kafka Connect's Time and Timestamp,
    milliseconds) through a real Debezium: the target holds what the events carry -- the
    source's values, times and timestamps to the millisecond under ``connect`` (Debezium
    drops the microseconds), every numeric of this table exact under ``double`` (each has at
    most 13 significant digits)."""
    source_dsn, connect_url = debezium.source_dsn, debezium.connect_url
    table, prefix, topic, schema, target = _source_and_target(debezium, services, "modes")
    register_connector(connect_url, prefix, postgres_connector(source_dsn, prefix, table) | {
        "decimal.handling.mode": decimals, "time.precision.mode": times})
    casts = {"at": "time(3)", "seen": "timestamp(3)"} if times == "connect" else {}
    member = None
    try:
        wait_until(lambda: topic in debezium.topics(), timeout_s=120,
                   what="Debezium's topic of the table")
        member = WorkerProc(topic=topic, group=f"g{prefix}", schema=schema,
                            setup=GROUP_SETUPS[-1], name="modes", extra=(
                                "--sink", f"table={schema}.{table}", "--sink-envelope",
                                "debezium", "--sink-key-format", "json"))
        asyncio.run(execute(source_dsn, *workload(table)[1:3]))  # updates of every column
        want = asyncio.run(_expected(source_dsn, table, casts))

        def replicated() -> bool:
            return asyncio.run(rows(services.dsn, target)) == want

        try:
            wait_until(replicated, timeout_s=120, interval_s=1.0,
                       what="the target equal to the source")
        except AssertionError:
            pass
        got = asyncio.run(rows(services.dsn, target))
        assert got == want, _difference(got, want)
        assert len(got) == 60
    finally:
        if member is not None:
            stop_live([member])
            member.ensure_dead()
        delete_connector(connect_url, prefix)
        asyncio.run(drop_slot(source_dsn, f"{prefix}_slot"))


#: columns whose values are TOASTed out of line (64 KB of hex each), and how row 1 fills them
_TOASTED = {"big": ("text", "string_agg(md5(g::text), '')"),
            "blob": ("bytea", "decode(string_agg(md5(g::text), ''), 'hex')"),
            "doc": ("jsonb", "to_jsonb(string_agg(md5(g::text), ''))"),
            "arr": ("text[]", "array_agg(md5(g::text))"),
            "nums": ("int[]", "array_agg(g)")}
_SMALL = {"text": "'b'", "bytea": "'\\x01'", "jsonb": "'[]'", "text[]": "'{}'", "int[]": "'{}'"}


def _quarantined(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return asyncio.run(fetch(dsn, f'SELECT "offset", reason FROM "{schema}".quarantine '
                                  'ORDER BY "offset"'))


@pytest.mark.parametrize("toasted", [list(_TOASTED), ["big", "blob", "arr", "nums"]],
                         ids=["with-jsonb", "text-bytea-arrays"])
def test_an_update_that_leaves_a_toasted_value_out_keeps_it_in_the_replica(
        debezium: Any, services: Any, toasted: list[str]) -> None:
    """Under REPLICA IDENTITY DEFAULT an update that leaves a TOASTed value unchanged comes
    from Debezium 3.6.1 with its placeholder (``__debezium_unavailable_value``: the string
    for text and jsonb, its bytes for bytea, ``[placeholder]`` for a text array, the bytes'
    codes for an int array) instead of the value: the sink updates the row's other columns
    and keeps what it lacks, through a member SIGKILLed between the updates; an update of
    the large values carries them. The target equals the source, nothing quarantined. A
    primary-key change's create lacks them too: quarantined, until REPLICA IDENTITY FULL
    lets the row's next update bring it whole."""
    source_dsn, connect_url = debezium.source_dsn, debezium.connect_url
    clean_leftovers(connect_url, source_dsn)
    table, prefix = f"toast_{uuid.uuid4().hex[:6]}", f"{PREFIX}{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.public.{table}"
    ddl = "(id int PRIMARY KEY, small int, " + ", ".join(
        f"{c} {_TOASTED[c][0]}" for c in toasted) + ")"
    big = ", ".join(_TOASTED[c][1] for c in toasted)
    small = ", ".join(_SMALL[_TOASTED[c][0]] for c in toasted)
    asyncio.run(execute(source_dsn, f"CREATE TABLE {table} {ddl}",
                         f"INSERT INTO {table} SELECT 1, 1, {big} FROM generate_series(1, 2000) g",
                         f"INSERT INTO {table} VALUES (2, 1, {small})"))
    schema = asyncio.run(fresh_schema(services.dsn))
    target = f'"{schema}".{table}'
    asyncio.run(execute(services.dsn, f"CREATE TABLE {target} {ddl}"))
    cols = ", ".join(["id", "small", *toasted])
    register_connector(connect_url, prefix, postgres_connector(source_dsn, prefix, table))
    members: list[WorkerProc] = []

    def table_rows(dsn: str, name: str) -> list[tuple[Any, ...]]:
        return asyncio.run(fetch(dsn, f"SELECT {cols} FROM {name} ORDER BY id"))

    def member(n: int) -> WorkerProc:
        return WorkerProc(topic=topic, group=f"g{prefix}", schema=schema,
                          setup=GROUP_SETUPS[-1], name=f"toast{n}", extra=(
                              "--sink", f"table={schema}.{table}", "--sink-envelope",
                              "debezium", "--sink-key-format", "json"))

    try:
        wait_until(lambda: topic in debezium.topics(), timeout_s=120,
                   what="Debezium's topic of the table")
        members.append(member(1))
        snapshot = table_rows(source_dsn, table)
        wait_until(lambda: table_rows(services.dsn, target) == snapshot, timeout_s=120,
                   interval_s=1.0, what="the snapshot in the target")
        asyncio.run(execute(source_dsn, f"UPDATE {table} SET small = 2 WHERE id = 1",
                             f"UPDATE {table} SET small = 3 WHERE id = 2"))
        members[0].signal(signal.SIGKILL)
        members[0].ensure_dead()
        asyncio.run(execute(source_dsn, f"UPDATE {table} SET small = small + 10"))
        members.append(member(2))
        want = table_rows(source_dsn, table)
        assert want[0][1] == 12 and want[0][2:] == snapshot[0][2:]
        wait_until(lambda: table_rows(services.dsn, target) == want, timeout_s=120,
                   interval_s=1.0, what="the updates in the target, the large values kept")
        # new large values of the same size (an event of both images under REPLICA
        # IDENTITY FULL below stays under Kafka Connect's 1 MiB max.request.size)
        asyncio.run(execute(source_dsn, f"UPDATE {table} SET ({', '.join(toasted)}) = "
                             f"(SELECT {big} FROM generate_series(2, 2001) g) WHERE id = 1"))
        want = table_rows(source_dsn, table)
        wait_until(lambda: table_rows(services.dsn, target) == want, timeout_s=120,
                   interval_s=1.0, what="the large values' update in the target")
        assert _quarantined(services.dsn, schema) == []
        # a primary-key change: the new key's create lacks the large values (quarantined),
        # the old key's delete applies; under REPLICA IDENTITY FULL the row's next update
        # carries every value, and the replica has the row again
        asyncio.run(execute(source_dsn, f"UPDATE {table} SET id = 10 WHERE id = 1"))
        wait_until(lambda: _quarantined(services.dsn, schema), timeout_s=120,
                   interval_s=1.0, what="the new key's create quarantined")
        [(_offset, reason)] = _quarantined(services.dsn, schema)
        assert f"op c: {', '.join(toasted)} hold Debezium's placeholder" in reason, reason
        assert "REPLICA IDENTITY FULL" in reason
        asyncio.run(execute(source_dsn, f"ALTER TABLE {table} REPLICA IDENTITY FULL",
                             f"UPDATE {table} SET small = 99 WHERE id = 10"))
        want = table_rows(source_dsn, table)
        wait_until(lambda: table_rows(services.dsn, target) == want, timeout_s=120,
                   interval_s=1.0, what="the changed key's row whole in the target")
        assert [r[0] for r in want] == [2, 10]
    finally:
        stop_live(members)
        for m in members:
            m.ensure_dead()
        delete_connector(connect_url, prefix)
        asyncio.run(drop_slot(source_dsn, f"{prefix}_slot"))
        asyncio.run(execute(source_dsn, f"DROP TABLE IF EXISTS {table}",
                             f"DROP PUBLICATION IF EXISTS {prefix}_pub"))
