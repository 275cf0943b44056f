"""Which statement the table sink's COPY method writes a small set of upserts with
(``Writer.unnest_insert``, pure): one INSERT … SELECT FROM unnest of one array per column,
unless a column cannot go as such an array. Both ways write the same rows against real
PostgreSQL: tests/integration/test_table_sink.py, ``write_path``."""

from __future__ import annotations

from fencing.postgres.sink.catalog import Method, Target
from fencing.postgres.sink.rows import Layout
from fencing.postgres.sink.values import Column
from fencing.postgres.sink.writer import Writer

PLAIN = (Column("id", "int8", True), Column("name", "text"), Column("price", "numeric"),
         Column("kafka_timestamp", "timestamptz"))


def _writer(*columns: Column, keys: tuple[str, ...] = ("id",), version: str | None = None,
            method: Method = Method.COPY) -> Writer:
    layout = Layout(columns, keys=keys)
    return Writer(Target("public", "items", layout, frozenset(c.name for c in columns)),
                  method, version=version)


def test_a_set_of_built_in_scalar_columns_goes_as_one_array_per_column_in_key_order() -> None:
    w = _writer(*PLAIN)
    sql = w.unnest_insert(("id", "name", "kafka_timestamp"))
    assert sql == (
        'INSERT INTO "public"."items" ("id", "name", "kafka_timestamp") SELECT "id", "name", '
        + w._value("kafka_timestamp", '"kafka_timestamp"')
        + ' FROM unnest($1::int8[], $2::text[], $3::int8[]) AS fence_rows("id", "name", '
        '"kafka_timestamp") ORDER BY "id" ON CONFLICT ("id") DO UPDATE SET "name" = '
        'EXCLUDED."name", "price" = EXCLUDED."price", "kafka_timestamp" = '
        'EXCLUDED."kafka_timestamp"')
    assert w.ms == "kafka_timestamp"  # passed as milliseconds, converted by the statement
    assert w.unnest_insert(("id", "name", "kafka_timestamp")) is sql  # kept per column set


def test_an_array_or_an_enum_column_goes_through_the_staging_table() -> None:
    w = _writer(*PLAIN, Column("tags", "_text"), Column("mood", "mood", labels=("ok",)),
                Column("moods", "_mood", labels=("ok",)))
    assert w.unnest_insert(("id", "tags")) is None  # unnest flattens an array of arrays
    assert w.unnest_insert(("id", "mood")) is None  # its type is the table schema's
    assert w.unnest_insert(("id", "moods")) is None
    assert w.unnest_insert(("id", "name")) is not None


def test_with_a_version_column_the_statement_leaves_newer_rows_alone() -> None:
    w = _writer(Column("id", "int8", True), Column("name", "text"), Column("lsn", "int8"),
                version="lsn")
    sql = w.unnest_insert(("id", "name", "lsn"))
    assert sql is not None
    assert sql.startswith('INSERT INTO "public"."items" AS fence_row ("id", "name", "lsn")')
    assert sql.endswith(' WHERE fence_row."lsn" IS NULL OR fence_row."lsn" <= EXCLUDED."lsn"')


def test_without_key_columns_the_rows_are_inserted_in_their_order() -> None:
    w = _writer(*PLAIN, keys=())
    assert w.unnest_insert(("id", "name")) == (
        'INSERT INTO "public"."items" ("id", "name") SELECT "id", "name" FROM '
        'unnest($1::int8[], $2::text[]) AS fence_rows("id", "name")')


def test_a_bit_column_goes_as_varbit_which_keeps_the_whole_string() -> None:
    w = _writer(Column("id", "int8", True), Column("b", "bit", max_chars=4),
                Column("v", "varbit", max_chars=6))
    sql = w.unnest_insert(("id", "b", "v"))
    assert sql is not None and "unnest($1::int8[], $2::varbit[], $3::varbit[])" in sql
