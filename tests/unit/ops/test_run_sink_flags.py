"""``fencectl run --sink table=NAME [--sink-key COL]``: the table sink's factory, no handler."""

from __future__ import annotations

import argparse
import re

import pytest

from fencing.errors import ConfigError
from fencing.handler import HandlerContext, build_handler
from fencing.postgres.sink import Method, SinkSpec
from fencing.postgres.sink.keys import Format
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


def test_sink_formats_and_composite_keys_become_settings_and_the_registry_comes_from_env(
        ) -> None:
    env = {**ENV, "SCHEMA_REGISTRY_URL": "http://u:pw@reg:8081/apis/ccompat/v7"}
    cfg = config_from_args(run_args("--sink", "table=t", "--sink-key", "region, id",
                                    "--sink-format", "avro", "--sink-key-format", "json"), env)
    assert dict(cfg.handler_settings) == {
        "table": "t", "key": "region, id", "format": "avro", "key_format": "json",
        "registry": "http://u:pw@reg:8081/apis/ccompat/v7"}
    spec = SinkSpec.from_settings(cfg.handler_settings)
    assert (spec.keys, spec.value_format, spec.key_format) == (
        ("region", "id"), Format.AVRO, Format.JSON)
    assert "pw" not in repr(spec)  # the registry URL may hold credentials


@pytest.mark.parametrize(("extra", "named"), [
    (("--sink-format", "avro"), "avro needs a schema registry: set SCHEMA_REGISTRY_URL"),
    (("--sink-key-format", "protobuf"), "protobuf needs a schema registry"),
    (("--sink-format", "xml"), "--sink-format xml: use string | json | avro"),
    (("--sink-format", "string"), "--sink-format string: a value is json, avro"),
    (("--sink-key", "a,,b"), "--sink-key a,,b: expected COLUMN or COLUMN,COLUMN"),
    (("--sink-key", "a,a"), "--sink-key a,a: expected COLUMN"),
])
def test_sink_format_mistakes_are_named_before_anything_starts(extra: tuple[str, ...],
                                                               named: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_args(run_args("--sink", "table=t", *extra), ENV)
    assert named in str(info.value)


@pytest.mark.parametrize("flag", ["--sink-format", "--sink-key-format"])
def test_sink_format_flags_need_the_sink(flag: str) -> None:
    with pytest.raises(ConfigError, match=f"{flag} json: needs --sink table=NAME"):
        config_from_args(run_args(flag, "json"), ENV)


def test_sink_evolve_from_the_flag_or_env_and_the_ddl_dsn_from_env_only() -> None:
    ddl = "postgresql://owner:secret@db/app"
    env = {**ENV, "FENCE_DDL_DSN": ddl}
    cfg = config_from_args(run_args("--sink", "table=t", "--sink-evolve", "add-columns"), env)
    assert dict(cfg.handler_settings) == {"table": "t", "evolve": "add-columns",
                                          "ddl_dsn": ddl}
    spec = SinkSpec.from_settings(cfg.handler_settings)
    assert spec.evolve and spec.ddl_dsn == ddl and "secret" not in repr(spec)
    by_env = config_from_args(run_args("--sink", "table=t"),
                              {**env, "FENCE_SINK_EVOLVE": "add-columns"})
    assert SinkSpec.from_settings(by_env.handler_settings).evolve
    flag_wins = config_from_args(run_args("--sink", "table=t", "--sink-evolve", "none"),
                                 {**env, "FENCE_SINK_EVOLVE": "add-columns"})
    assert not SinkSpec.from_settings(flag_wins.handler_settings).evolve
    plain = config_from_args(run_args("--sink", "table=t"), env)  # the DSN only when evolving
    assert "ddl_dsn" not in plain.handler_settings
    # FENCE_SINK_EVOLVE is the sink's: without --sink it does nothing
    assert config_from_args(run_args(), {**env, "FENCE_SINK_EVOLVE": "add-columns"}).handler


@pytest.mark.parametrize(("extra", "env", "named"), [
    (("--sink-evolve", "add-columns"), {}, "--sink-evolve add-columns needs FENCE_DDL_DSN"),
    (("--sink-evolve", "yes"), {"FENCE_DDL_DSN": "postgresql://a/b"},
     "--sink-evolve yes: use none | add-columns"),
])
def test_sink_evolve_mistakes_are_named(extra: tuple[str, ...], env: dict[str, str],
                                        named: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_args(run_args("--sink", "table=t", *extra), {**ENV, **env})
    assert named in str(info.value)


@pytest.mark.parametrize(("topic", "why"), [
    ("__debezium-heartbeat.shop", "Debezium's heartbeat topic"),
    ("shop.transaction", "without row changes (transaction)"),
    ("shop-schema-changes", "without row changes (schema-changes)"),
])
def test_the_envelope_refuses_debezium_s_topics_without_row_changes(topic: str,
                                                                    why: str) -> None:
    args = cli.build_parser().parse_args(["run", "--topic", topic, "--group", "g", "--sink",
                                          "table=t", "--sink-envelope", "debezium"])
    with pytest.raises(ConfigError, match=re.escape(why)) as refused:
        config_from_args(args, {"KAFKA_BOOTSTRAP_SERVERS": "k:9", "FENCE_DSN": "postgresql://h"})
    assert str(refused.value).startswith(f"--topic {topic}: ")
    table = cli.build_parser().parse_args(["run", "--topic", "shop.public.customers", "--group",
                                           "g", "--sink", "table=t", "--sink-envelope",
                                           "debezium"])
    cfg = config_from_args(table, {"KAFKA_BOOTSTRAP_SERVERS": "k:9", "FENCE_DSN": "postgresql://h"})
    assert cfg.handler_settings["envelope"] == "debezium"


def test_the_version_guard_flags_become_the_spec() -> None:
    cfg = config_from_args(run_args("--sink", "table=t", "--sink-envelope", "debezium",
                                    "--sink-version-column", "lsn", "--sink-version-from",
                                    "source.lsn"), ENV)
    spec = SinkSpec.from_settings(cfg.handler_settings)
    assert (spec.version, spec.version_from, spec.version_source) == ("lsn", "source.lsn", "lsn")
    row = SinkSpec.from_settings(config_from_args(run_args(
        "--sink", "table=t", "--sink-key", "id", "--sink-version-column", "rev"),
        ENV).handler_settings)
    assert (row.version, row.version_from, row.version_source) == ("rev", "row", None)


@pytest.mark.parametrize(("extra", "named"), [
    (("--sink-version-column", "rev"), "--sink-version-column rev: needs --sink-key"),
    (("--sink-key", "id", "--sink-version-column", "id"), "a key column cannot be the version"),
    (("--sink-key", "id", "--sink-version-from", "source.lsn"),
     "--sink-version-from: needs --sink-version-column COL"),
    (("--sink-key", "id", "--sink-version-column", "v", "--sink-version-from", "source.lsn"),
     "--sink-version-from source.lsn: needs --sink-envelope debezium"),
    (("--sink-envelope", "debezium", "--sink-version-column", "v", "--sink-version-from",
      "lsn"), "--sink-version-from lsn: use row"),
    (("--sink-envelope", "debezium", "--sink-version-column", "v", "--sink-version-from",
      "source."), "--sink-version-from source.: use row"),
])
def test_version_guard_mistakes_are_named_before_anything_starts(extra: tuple[str, ...],
                                                                  named: str) -> None:
    with pytest.raises(ConfigError) as info:
        SinkSpec.from_settings(config_from_args(run_args("--sink", "table=t", *extra),
                                                ENV).handler_settings)
    assert named in str(info.value)


def test_the_version_guard_needs_the_copy_method() -> None:
    with pytest.raises(ConfigError, match="the guard writes by the copy method"):
        SinkSpec.from_settings({"table": "t", "key": "id", "version": "v",
                                "method": "executemany"})
