"""``fencectl run --sink table=NAME [--sink-key COL]``: the table sink's factory, no handler."""

from __future__ import annotations

import argparse

import pytest

from fencing.errors import ConfigError
from fencing.handler import HandlerContext, build_handler
from fencing.postgres.sink import Method, SinkSpec
from ops import cli
from ops.commands.run import SINK_BATCH_MAX_RECORDS, SINK_HANDLER, config_from_args

ENV = {"KAFKA_BOOTSTRAP_SERVERS": "localhost:9092", "FENCE_DSN": "postgresql://x/y"}


def run_args(*extra: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["run", "--topic", "orders", "--group", "g", *extra])


def test_sink_selects_the_table_sink_factory_with_its_settings() -> None:
    cfg = config_from_args(run_args("--sink", "table=sales.orders", "--sink-key", "id"), ENV)
    assert cfg.handler == SINK_HANDLER
    assert dict(cfg.handler_settings) == {"table": "sales.orders", "key": "id"}
    loaded = build_handler(cfg.handler, HandlerContext("fence", "g", ("orders",),
                                                       cfg.handler_settings))
    assert loaded.ensure_tables is not None  # created or validated at start


def test_the_sink_batches_bigger_by_default_and_an_explicit_bound_wins() -> None:
    assert config_from_args(run_args(), ENV).batch_max_records == 500
    assert config_from_args(run_args("--sink", "table=o"), ENV).batch_max_records \
        == SINK_BATCH_MAX_RECORDS == 2000
    for extra in (("--sink", "table=o"), ()):
        got = config_from_args(run_args(*extra, "--batch-max-records", "300"), ENV)
        assert got.batch_max_records == 300


def test_without_sink_the_reference_handler_stays_the_default() -> None:
    cfg = config_from_args(run_args(), ENV)
    assert cfg.handler == "ops.reference.pg:reference" and dict(cfg.handler_settings) == {}


@pytest.mark.parametrize(("extra", "named"), [
    (("--sink-key", "id"), "--sink-key id: needs --sink table=NAME"),
    (("--sink", "orders"), "--sink orders: expected table=NAME"),
    (("--sink", "file=orders"), "--sink file=orders: expected table=NAME"),
    (("--sink", "table=o", "--handler", "m:h"), "the sink is the handler"),
    (("--sink", "table=o", "--handler-setting", "a=b"), "--handler-setting: not for --sink"),
])
def test_sink_mistakes_are_named(extra: tuple[str, ...], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_args(run_args(*extra), ENV)
    assert named in str(info.value)


def test_sink_spec_from_settings() -> None:
    assert SinkSpec.from_settings({"table": "a.b", "key": "id", "method": "executemany"}) == \
        SinkSpec("a.b", ("id",), Method.EXECUTEMANY)
    assert SinkSpec("a.b").quoted == '"a"."b"' and SinkSpec('we"ird').quoted == '"we""ird"'
    for bad, named in (({"table": "a.b.c"}, "expected table=NAME"),
                       ({"table": "t", "colour": "x"}, "--handler-setting colour"),
                       ({"table": "t", "method": "fast"}, "method=fast")):
        with pytest.raises(ConfigError, match=named):
            SinkSpec.from_settings(bad)
