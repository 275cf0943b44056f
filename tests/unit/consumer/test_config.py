"""Worker configuration: -X pass-through, conflicts refused by name, DSN redaction."""

from __future__ import annotations

import pytest

from consumer.config import (
    GroupProtocol,
    WorkerConfig,
    kafka_settings,
    parse_x_options,
    redact,
    redact_dsn,
)
from consumer.exits import ExitCode, exit_code_for
from fencing.errors import (
    ConfigError,
    Fenced,
    OutcomeUnknown,
    RecreatedTopic,
    RetentionGap,
    Retired,
    SchemaMismatch,
    StoreUnavailable,
)

DSN = "postgresql://fw:s3cretpw@127.0.0.1:5432/db"


def cfg(**kw: object) -> WorkerConfig:
    base: dict[str, object] = dict(topics=("t",), group_id="g", bootstrap_servers="127.0.0.1:9092",
                                   dsn=DSN, handler="m:h")
    base.update(kw)
    return WorkerConfig(**base)  # type: ignore[arg-type]


def test_defaults_make_a_worker_owned_consumer() -> None:
    s = kafka_settings(cfg())
    assert s["enable.auto.commit"] == "false"
    assert s["enable.auto.offset.store"] == "false"
    assert s["auto.offset.reset"] == "error"
    assert s["group.protocol"] == "classic"
    assert s["partition.assignment.strategy"] == "cooperative-sticky"
    assert cfg().cooperative


def test_prefetch_is_bounded_and_refetches_soon_and_x_can_change_either() -> None:
    # librdkafka waits fetch.queue.backoff.ms (default 1 s) before fetching again once its
    # queue reached queued.max.messages.kbytes; measured: the worker starved for ~0.5 s at a
    # time behind its 4 MiB bound (docs/benchmarks.md)
    s = kafka_settings(cfg())
    assert (s["queued.max.messages.kbytes"], s["fetch.queue.backoff.ms"]) == ("4096", "10")
    s = kafka_settings(cfg(x_options=parse_x_options(["fetch.queue.backoff.ms=1000"])))
    assert s["fetch.queue.backoff.ms"] == "1000"


def test_x_options_pass_through() -> None:
    s = kafka_settings(cfg(x_options=parse_x_options(["fetch.min.bytes=1", "client.id = me"])))
    assert s["fetch.min.bytes"] == "1" and s["client.id"] == "me"


@pytest.mark.parametrize("x, named", [
    ("enable.auto.commit=true", "enable.auto.commit"),
    ("enable.auto.offset.store=true", "enable.auto.offset.store"),
    ("group.id=other", "group.id"),
    ("group.protocol=consumer", "group.protocol"),
    ("auto.offset.reset=latest", "auto.offset.reset"),
    ("partition.assignment.strategy=range", "partition.assignment.strategy"),
])
def test_conflicting_x_is_refused_naming_the_setting(x: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        cfg(x_options=parse_x_options([x])).check()


@pytest.mark.parametrize("key", ["session.timeout.ms", "heartbeat.interval.ms",
                                 "partition.assignment.strategy", "group.protocol.type"])
def test_kip848_refuses_client_side_group_settings(key: str) -> None:
    c = cfg(group_protocol=GroupProtocol.CONSUMER, x_options={key: "1000"})
    with pytest.raises(ConfigError, match=key):
        c.check()


def test_kip848_is_incremental_and_sets_no_assignor() -> None:
    c = cfg(group_protocol=GroupProtocol.CONSUMER)
    s = kafka_settings(c)
    assert s["group.protocol"] == "consumer" and "partition.assignment.strategy" not in s
    assert c.cooperative


@pytest.mark.parametrize("strategy, coop", [("range", False), ("roundrobin", False),
                                            ("range,roundrobin", False),
                                            ("cooperative-sticky", True)])
def test_assignors(strategy: str, coop: bool) -> None:
    c = cfg(assignment_strategy=strategy)
    c.check()
    assert c.cooperative is coop


@pytest.mark.parametrize("strategy", ["range,cooperative-sticky", "sticky", ""])
def test_bad_assignors_refused(strategy: str) -> None:
    with pytest.raises(ConfigError, match="assignment-strategy"):
        cfg(assignment_strategy=strategy).check()


@pytest.mark.parametrize("field, value, named", [
    ("batch_max_records", 0, "--batch-max-records"),
    ("batch_max_bytes", 0, "--batch-max-bytes"),
    ("shutdown_timeout_s", 0.0, "--shutdown-timeout-s"),
    ("schema", "Bad-Name", "--schema"),
    ("auto_offset_reset", "none", "--auto-offset-reset"),
    ("dsn", "", "FENCE_DSN"),
    ("bootstrap_servers", "", "KAFKA_BOOTSTRAP_SERVERS"),
    ("budget_s", 0.0, "--call-budget-s"),
    ("db_idle_in_transaction_timeout_s", 20.0, "--call-budget-s"),  # not below the budget
])
def test_invalid_values_name_the_setting(field: str, value: object, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        cfg(**{field: value}).check()


def test_malformed_x_is_refused() -> None:
    with pytest.raises(ConfigError, match="-X"):
        parse_x_options(["novalue"])


@pytest.mark.parametrize("dsn, secret", [
    ("postgresql://fw:s3cretpw@h:5432/db", "s3cretpw"),
    ("postgresql://h/db?user=fw&password=s3cretpw&sslmode=disable", "s3cretpw"),
    ("host=h user=fw password=s3cretpw dbname=db", "s3cretpw"),
    ("host=h password='s3 cret pw' dbname=db", "s3 cret pw"),
])
def test_dsn_password_never_rendered(dsn: str, secret: str) -> None:
    assert secret not in redact_dsn(dsn)
    assert secret not in redact(f"could not connect with {dsn}: boom {secret}", dsn=dsn)


def test_dsn_not_in_repr() -> None:
    assert "s3cretpw" not in repr(cfg())


@pytest.mark.parametrize("exc, code", [
    (ConfigError("x"), ExitCode.CONFIG), (SchemaMismatch("x"), ExitCode.CONFIG),
    (RecreatedTopic("x"), ExitCode.SOURCE_REFUSED), (RetentionGap("x"), ExitCode.SOURCE_REFUSED),
    (Fenced("x"), ExitCode.RETIRED), (Retired("x"), ExitCode.RETIRED),
    (OutcomeUnknown("x"), ExitCode.RETIRED), (StoreUnavailable("x"), ExitCode.UNAVAILABLE),
    (RuntimeError("x"), ExitCode.INTERNAL),
])
def test_exit_codes(exc: BaseException, code: ExitCode) -> None:
    assert exit_code_for(exc) is code


def test_handler_settings_parse_like_x_options_naming_their_flag() -> None:
    assert parse_x_options(["table = orders_sink "], flag="--handler-setting",
                           strip_values=False) == {"table": " orders_sink "}
    with pytest.raises(ConfigError, match="--handler-setting 'novalue': expected key=value"):
        parse_x_options(["novalue"], flag="--handler-setting")


def test_topics_and_pattern_make_one_subscription() -> None:
    assert cfg(topics=("a", "b", "a")).subscription == ["a", "b"]
    assert cfg(topics=("a",), topic_pattern="orders-[0-9]+").subscription == [
        "a", "^orders-[0-9]+"]
    assert cfg(topics=(), topic_pattern="^x.*").subscription == ["^x.*"]


@pytest.mark.parametrize("kw, named", [
    (dict(topics=()), "--topic or --topic-pattern is required"),
    (dict(topics=("^a.*",)), "--topic '^a.*': a topic name"),
    (dict(topic_pattern="("), "--topic-pattern '(': not a regular expression"),
    (dict(topic_pattern=r"t-\d+"), r"\d is not POSIX extended regex"),
])
def test_topic_mistakes_are_refused(kw: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        cfg(**kw).check()
    assert named in str(err.value)


def test_the_call_budget_is_a_flag_and_bounds_the_idle_timeout() -> None:
    cfg(budget_s=60.0, db_idle_in_transaction_timeout_s=30.0).check()  # raised together
    with pytest.raises(ConfigError, match="less than the 60 s lifetime budget"):
        cfg(budget_s=60.0, db_idle_in_transaction_timeout_s=60.0).check()
