"""The table sink's routing (``fencing.postgres.sink.routes``): template checks, the
``.`` -> ``_`` rule and the 63-byte shortening."""

from __future__ import annotations

import pytest

from fencing.errors import ConfigError
from fencing.postgres.sink import SinkSpec
from fencing.postgres.sink.routes import MAX_NAME_BYTES, check_template, route


def test_a_template_names_a_table_per_topic() -> None:
    assert route("{topic}", "orders") == "orders"
    assert route("raw.{topic}", "Orders-EU") == "raw.Orders-EU"
    assert route("{topic}_rows", "a.b") == "a_b_rows"
    assert route("fixed", "orders") == "fixed"


def test_a_long_name_is_shortened_to_distinct_63_byte_names() -> None:
    a, b = "t" * 200 + "a", "t" * 200 + "b"
    ra, rb = route("raw.{topic}", a), route("raw.{topic}", b)
    assert ra != rb
    assert ra.startswith("raw." + "t" * 54 + "_")
    assert len(ra.split(".")[1].encode()) == MAX_NAME_BYTES
    exact = "x" * MAX_NAME_BYTES
    assert route("{topic}", exact) == exact


@pytest.mark.parametrize(("template", "says"), [
    ("{topic}.t", "not in its schema"),
    ("{topics}", "the only placeholder"),
    ("t_{", "the only placeholder"),
])
def test_bad_templates_are_refused(template: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        check_template(template)
    with pytest.raises(ConfigError, match=says):
        SinkSpec.from_settings({"table": template})


def test_spec_for_topic() -> None:
    spec = SinkSpec.from_settings({"table": "s.{topic}", "key": "id"})
    assert spec.routed
    assert spec.for_topic("a.b").table == "s.a_b"
    assert spec.for_topic("a.b").keys == ("id",)
    plain = SinkSpec.from_settings({"table": "t"})
    assert not plain.routed and plain.for_topic("x") is plain
