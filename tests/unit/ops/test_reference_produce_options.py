"""``fencectl produce`` argument handling (pure): defaults, environment, refusals."""

from __future__ import annotations

import pytest

import ops.reference as reference
from ops.cli import build_parser
from ops.commands.produce import ProduceOptions, options_from_args


def opts(argv: list[str], env: dict[str, str] | None = None) -> ProduceOptions | str:
    args = build_parser().parse_args(["produce", *argv])
    return options_from_args(args, env or {})


BASE = ["--topic", "t", "--count", "200000", "--seed", "3", "--class", "conflict"]


def test_defaults_and_environment() -> None:
    got = opts(BASE, {"KAFKA_BOOTSTRAP_SERVERS": "k:9092"})
    assert got == ProduceOptions(
        topic="t", count=200000, seed=3, klass="conflict", partitions=6, bootstrap="k:9092",
        span_every=40, otlp_endpoint=None,
    )
    env = {"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://o:4317"}
    got = opts([*BASE, "--bootstrap", "b:1", "--partitions", "3", "--span-every", "7"], env)
    assert isinstance(got, ProduceOptions)
    assert (got.bootstrap, got.partitions, got.span_every, got.otlp_endpoint) == (
        "b:1", 3, 7, "http://o:4317")
    assert opts(BASE, {**env, "OTEL_SDK_DISABLED": "true"}).otlp_endpoint is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--topic", "t", "--count", "-1", "--seed", "1", "--class", "valid"], None, "--count"),
        ([*BASE, "--partitions", "0"], None, "--partitions"),
        ([*BASE, "--replication-factor", "0"], None, "--replication-factor"),
        ([*BASE, "--span-every", "-2"], None, "--span-every"),
        (["--topic", " ", "--count", "1", "--seed", "1", "--class", "valid"], None, "--topic"),
        (BASE, {}, "KAFKA_BOOTSTRAP_SERVERS"),
    ],
)
def test_refusals_name_the_argument(
    argv: list[str], env: dict[str, str] | None, needle: str
) -> None:
    got = opts(argv, {"KAFKA_BOOTSTRAP_SERVERS": "k:1"} if env is None else env)
    assert isinstance(got, str) and needle in got


def test_unknown_class_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["produce", "--topic", "t", "--count", "1", "--seed", "1",
                                   "--class", "mixed"])
    assert exc.value.code == 2


def test_reference_exports_exist() -> None:
    for name in reference.__all__:
        assert getattr(reference, name) is not None, name
