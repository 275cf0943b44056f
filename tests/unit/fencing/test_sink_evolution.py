"""The table sink's evolution, pure parts: a JSON field's column type, the fields a batch's
values hold without a column, the count of what is ignored, and the conversion noting the
values that hold such fields."""

from __future__ import annotations

import decimal

from fencing.postgres.sink.evolve import add_columns, json_column, strays
from fencing.postgres.sink.rows import Column, Layout, converter
from fencing.postgres.sink.schemas import Field
from fencing.postgres.sink.unknown import MAX_FIELDS, UnknownFields
from fencing.types import SourceRecord


def test_a_json_fields_column_is_typed_from_its_values() -> None:
    assert json_column([True, False, None]) == "bool"
    assert json_column([1, 2]) == "int8"
    assert json_column([1, 2.5]) == json_column([decimal.Decimal("1.5")]) == "numeric"
    assert json_column(["a"]) == "text"
    assert json_column([{"a": 1}]) == json_column([[1]]) == "jsonb"
    assert json_column([1, "a"]) == json_column([True, 1]) == "jsonb"  # mixed kinds
    assert json_column([None, None]) is None and json_column([]) is None


def test_strays_are_the_fields_without_a_column_with_their_values() -> None:
    got = strays([{"id": 1, "a": 2}, {"id": 2, "b": None, "a": 3}], {"id"})
    assert got == {"a": [2, 3], "b": [None]} and list(got) == ["a", "b"]


def test_add_columns_adds_nullable_columns_if_not_exists() -> None:
    assert add_columns('"s"."t"', [Field("Note", "text", True), Field("q", "int8", False)]) \
        == ('ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "Note" text;',
            'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "q" int8;')


def test_the_count_is_per_table_with_a_bounded_list_of_names() -> None:
    tally = UnknownFields()
    tally.add("s.t", (), 0)
    assert tally.records() == {"s.t": 0} and tally.detail() == {
        "s.t": {"records": 0, "fields": []}}
    tally.add("s.t", ["a", "b"], 3)
    tally.add("s.t", ["b", *(f"f{i}" for i in range(40))], 2)
    assert tally.records() == {"s.t": 5}
    fields = tally.detail()["s.t"]["fields"]
    assert fields[:3] == ["a", "b", "f0"] and len(fields) == MAX_FIELDS


def test_the_conversion_notes_each_value_holding_a_field_without_a_column() -> None:
    layout = Layout((Column("id", "int8", True, False, None),
                     Column("kafka_offset", "int8", False, False, None)))
    found: list[object] = []
    convert = converter(layout, known=frozenset({"id", "kafka_offset", "hidden"}),
                        strays=found)

    def record(value: bytes, offset: int) -> SourceRecord:
        return SourceRecord("t", 0, offset, None, value)
    for i, value in enumerate([b'{"id": 1}', b'{"id": 2, "hidden": 1}',
                               b'{"id": 3, "new": "x"}']):
        convert(record(value, i))
    assert found == [{"id": 3, "new": "x"}]  # "hidden": a column the sink does not write


async def test_a_writer_older_than_a_columns_ask_retries_and_a_newer_one_ignores_it() -> None:
    from types import SimpleNamespace

    from fencing.postgres.sink.catalog import SinkSpec
    from fencing.postgres.sink.evolving import Evolution

    evolution = Evolution(SinkSpec("s.t", evolve=True, ddl_dsn="postgresql://x/y"), None)
    table = SimpleNamespace(quoted='"s"."t"')
    evolution._asked[('"s"."t"', "a")] = 20  # its column made sure of at t=20
    older, newer = SimpleNamespace(t=table, born=10), SimpleNamespace(t=table, born=30)
    assert await evolution.fields(older, "t", {"a": [1]}) == ([], True)
    assert await evolution.fields(newer, "t", {"a": [1]}) == ([], False)  # never looped
    assert await evolution.fields(newer, "t", {"a": [1], "b": [2], "c": [None],
                                               "x" * 64: [1]}) == ([Field("b", "int8", False)],
                                                                   False)
