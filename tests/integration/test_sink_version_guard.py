"""The table sink's version guard (``--sink-version-column COL``) against real PostgreSQL,
through the fence store: an upsert or delete older than the stored row changes nothing and
is counted (``fence.sink.stale_changes``, a member row's ``sink_stale_changes``); one of
the same version applies again (a change event delivered twice: the same row); a newer one
applies. The version comes from a change event's ``source`` block (``source.lsn``) or from
the record's own column; a tombstone carries none and deletes unguarded."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fencing.postgres.sink import SinkSpec
from fencing.postgres.sink.keys import Format
from fencing.postgres.sink.unknown import STALE_CHANGES
from fencing.types import SourceRecord, TopicPartition
from tests.integration.sink_support import apply, fetch, write_path  # noqa: F401
from tests.integration.test_sink_debezium import DDL, TP, event, row, spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("write_path")]

OTHER = TopicPartition(TP.topic, 1)
GUARD = {"version": "lsn", "version_from": "source.lsn"}


def _stale(schema: str) -> int:
    return STALE_CHANGES.counts().get(f"{schema}.items", 0)


async def _table(dsn: str, schema: str, extra: str = ", lsn bigint") -> None:
    await fetch(dsn, f'CREATE TABLE "{schema}".items {DDL[:-1]}{extra})')


async def test_older_changes_from_another_partition_change_nothing_and_are_counted(
        pg_dsn: str, schema: str) -> None:
    """Partition 1 carries the newest image of key 1 (lsn 500) and is applied first; partition
    0's older update and delete of key 1 (lsn 101, 102) then change nothing, are counted,
    and its changes of other keys apply. The same event again (lsn 500) applies: the same
    row; a newer one (lsn 600) applies."""
    await _table(pg_dsn, schema)
    guarded = spec(schema, **GUARD)
    await apply(pg_dsn, schema, guarded, [event(0, "c", after=row(1, "newest"), lsn=500,
                                               tp=OTHER)], tp=OTHER)
    before = _stale(schema)
    quarantined = await apply(pg_dsn, schema, guarded, [
        event(0, "c", after=row(2, "two")),                        # lsn 100
        event(1, "u", before=row(1, "a"), after=row(1, "older")),  # lsn 101 < 500
        event(2, "d", before=row(1, "older")),                     # lsn 102 < 500
        event(3, None, key=1),                                     # its tombstone: nothing
        event(4, "u", before=row(2, "two"), after=row(2, "two v2")),
    ], tp=TP)
    assert quarantined == {}
    assert await fetch(pg_dsn, f'SELECT id, name, lsn FROM "{schema}".items ORDER BY id') == [
        (1, "newest", 500), (2, "two v2", 104)]
    assert _stale(schema) - before == 2
    await apply(pg_dsn, schema, guarded, [
        event(1, "u", after=row(1, "newest"), lsn=500, tp=OTHER),  # delivered again
        event(2, "u", after=row(1, "newer"), lsn=600, tp=OTHER)], tp=OTHER)
    assert await fetch(pg_dsn, f'SELECT id, name, lsn FROM "{schema}".items ORDER BY id') == [
        (1, "newer", 600), (2, "two v2", 104)]
    assert _stale(schema) - before == 2
    await apply(pg_dsn, schema, guarded, [event(5, "d", before=row(1, "x"), lsn=700)], tp=TP)
    assert await fetch(pg_dsn, f'SELECT id FROM "{schema}".items ORDER BY id') == [(2,)]


async def test_without_the_guard_the_older_change_wins(pg_dsn: str, schema: str) -> None:
    """The control: the same two partitions without ``--sink-version-column`` end with the
    older image (applied last), which is what the guard is for."""
    await _table(pg_dsn, schema)
    await apply(pg_dsn, schema, spec(schema), [event(0, "c", after=row(1, "newest"), lsn=500,
                                                    tp=OTHER)], tp=OTHER)
    await apply(pg_dsn, schema, spec(schema), [
        event(0, "u", before=row(1, "a"), after=row(1, "older"))], tp=TP)
    assert await fetch(pg_dsn, f'SELECT name FROM "{schema}".items') == [("older",)]


async def test_the_guard_holds_on_the_one_by_one_path(pg_dsn: str, schema: str) -> None:
    """A row PostgreSQL refuses (a CHECK) sends the batch one record at a time: the refused
    record is quarantined, the stale one still changes nothing and is counted."""
    await _table(pg_dsn, schema, ", lsn bigint, CHECK (name <> 'refused')")
    guarded = spec(schema, **GUARD)
    await apply(pg_dsn, schema, guarded, [event(0, "c", after=row(1, "newest"), lsn=500,
                                               tp=OTHER)], tp=OTHER)
    before = _stale(schema)
    quarantined = await apply(pg_dsn, schema, guarded, [
        event(0, "u", after=row(1, "older")),                      # lsn 100 < 500
        event(1, "c", after=row(2, "refused")),
        event(2, "c", after=row(3, "three"))], tp=TP)
    assert list(quarantined) == [1]
    assert await fetch(pg_dsn, f'SELECT id, name FROM "{schema}".items ORDER BY id') == [
        (1, "newest"), (3, "three")]
    assert _stale(schema) - before == 1


def _plain(offset: int, key: str, value: dict[str, Any] | None) -> SourceRecord:
    return SourceRecord("plain", 0, offset, key.encode(),
                        None if value is None else json.dumps(value).encode(),
                        timestamp_ms=1_700_000_000_000 + offset)


async def test_the_version_from_the_row_and_a_tombstone_deletes_unguarded(
        pg_dsn: str, schema: str) -> None:
    """Plain JSON records keyed by ``id``, versioned by their own ``rev``: an older rev
    changes nothing, a record without one is quarantined (it cannot be ordered), a
    tombstone deletes whatever is stored."""
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".items (id text PRIMARY KEY, v text, rev int)')
    plain = SinkSpec(f"{schema}.items", keys=("id",), key_format=Format.STRING, version="rev")
    before = _stale(schema)
    quarantined = await apply(pg_dsn, schema, plain, [
        _plain(0, "a", {"id": "a", "v": "a3", "rev": 3}),
        _plain(1, "a", {"id": "a", "v": "a2", "rev": 2}),              # older: nothing
        _plain(2, "b", {"id": "b", "v": "b1", "rev": 1}),
        _plain(3, "b", {"id": "b", "v": "b?"}),                         # no rev: quarantined
        _plain(4, "c", {"id": "c", "v": "c1", "rev": 1}),
        _plain(5, "c", None),                                           # tombstone: deletes
    ], tp=TopicPartition("plain", 0))
    assert quarantined == {3: "table sink: no version for --sink-version-column rev: the "
                              "record has no value for it"}
    assert await fetch(pg_dsn, f'SELECT id, v, rev FROM "{schema}".items ORDER BY id') == [
        ("a", "a3", 3), ("b", "b1", 1)]
    assert _stale(schema) - before == 1


async def test_an_update_without_a_toasted_value_is_guarded_like_any(pg_dsn: str,
                                                                     schema: str) -> None:
    """An update holding Debezium's placeholder (the columns it lacks kept) older than the
    stored row changes nothing and is counted; a newer one updates the other columns and
    the version, and keeps the value it lacks."""
    await _table(pg_dsn, schema)
    guarded = spec(schema, **GUARD)
    unavailable = "__debezium_unavailable_value"
    await apply(pg_dsn, schema, guarded, [event(0, "c", after=row(1, "newest", obj=1), lsn=500,
                                               tp=OTHER)], tp=OTHER)
    before = _stale(schema)
    quarantined = await apply(pg_dsn, schema, guarded, [
        event(0, "u", after=row(1, unavailable, obj=2)),           # lsn 100 < 500
        event(1, "u", after=row(1, unavailable, obj=3), lsn=600),
        event(2, "u", after=row(1, unavailable, obj=4), lsn=550)], tp=TP)  # older again
    assert quarantined == {}
    assert await fetch(pg_dsn, f'SELECT id, name, obj, lsn FROM "{schema}".items') == [
        (1, "newest", 3, 600)]
    assert _stale(schema) - before == 2
