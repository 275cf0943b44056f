"""ops.operator.handler_record: what a member records of its handler, and which recorded
handler a replay takes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fencing.errors import ConfigError
from ops.operator.handler_record import (
    SINK_HANDLER,
    HandlerChoice,
    choose,
    handler_from_flags,
    record_of,
    with_registry,
)
from ops.operator.member_view import MemberRow

NOW = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)
SINK = {"spec": SINK_HANDLER, "settings": {"table": "orders", "key": "id"}, "redacted": []}


def row(lifetime: str, handler: dict[str, Any] | None, *, state: str = "running",
        age_s: float = 1.0, started_min: int = 60) -> MemberRow:
    detail: dict[str, Any] = {"unavailable_after_s": 15}
    if handler is not None:
        detail["handler"] = handler
    return MemberRow(lifetime, "g", None, "h", 1, state, NOW - timedelta(minutes=started_min),
                     NOW - timedelta(seconds=age_s), detail)


def test_record_leaves_out_secret_looking_settings() -> None:
    got = record_of("m:f", {"table": "t", "db_password": "x", "API-Key": "y",
                            "url": "postgresql://u:s3cret@h/db", "plain_url": "http://h/x"})
    assert got == {"spec": "m:f", "settings": {"table": "t", "plain_url": "http://h/x"},
                   "redacted": ["API-Key", "db_password", "url"]}


def test_live_members_that_agree_give_their_handler() -> None:
    chosen = choose([row("lt-a", SINK), row("lt-b", SINK), row("lt-old", None)], group="g",
                    now=NOW, overrides={})
    assert (chosen.spec, dict(chosen.settings)) == (SINK_HANDLER, {"table": "orders",
                                                                   "key": "id"})
    assert chosen.source == "recorded by the group's live member lt-a"


def test_without_live_members_the_last_seen_one_counts() -> None:
    old = {"spec": "m:old", "settings": {}, "redacted": []}
    chosen = choose([row("lt-1", old, state="stopped", age_s=600),
                     row("lt-2", SINK, state="stopped", age_s=30),
                     row("lt-3", old, age_s=90)], group="g", now=NOW, overrides={})
    assert chosen.spec == SINK_HANDLER and chosen.source.startswith(
        "recorded by the group's last member lt-2")


def test_disagreeing_live_members_and_no_record_are_refused() -> None:
    other = {**SINK, "settings": {"table": "other"}}
    with pytest.raises(ConfigError, match="its live members run different handlers"):
        choose([row("lt-a", SINK), row("lt-b", other)], group="g", now=NOW, overrides={})
    with pytest.raises(ConfigError, match="no member recorded the handler"):
        choose([row("lt-a", None)], group="g", now=NOW, overrides={})


def test_overrides_fill_redacted_settings() -> None:
    secret = {"spec": "m:f", "settings": {"a": "1"}, "redacted": ["token"]}
    with pytest.raises(ConfigError, match="token"):
        choose([row("lt-a", secret)], group="g", now=NOW, overrides={})
    chosen = choose([row("lt-a", secret)], group="g", now=NOW, overrides={"token": "t",
                                                                          "a": "2"})
    assert dict(chosen.settings) == {"a": "2", "token": "t"}


def test_flags_name_the_sink_or_a_handler_or_nothing() -> None:
    assert handler_from_flags(handler=None, settings={}, sink=None) is None
    sink = handler_from_flags(handler=None, settings={}, sink="table=o",
                              sink_options={"sink_key": "id"})
    assert sink is not None and (sink.spec, dict(sink.settings)) == (
        SINK_HANDLER, {"table": "o", "key": "id"})
    with pytest.raises(ConfigError, match="the sink is the handler"):
        handler_from_flags(handler="m:f", settings={}, sink="table=o")


def test_the_registry_url_is_never_recorded_and_added_only_for_a_schemad_format() -> None:
    url = "http://user:pw@127.0.0.1:18081/apis/ccompat/v7"
    avro = handler_from_flags(handler=None, settings={}, sink="table=o",
                              sink_options={"sink_key": "id", "sink_format": "avro"},
                              registry=url)
    assert avro is not None and avro.settings["registry"] == url
    assert record_of(avro.spec, avro.settings) == {
        "spec": SINK_HANDLER, "settings": {"table": "o", "key": "id", "format": "avro"},
        "redacted": []}
    plain = handler_from_flags(handler=None, settings={}, sink="table=o", registry=url)
    assert plain is not None and "registry" not in plain.settings
    recorded = HandlerChoice(SINK_HANDLER, {"table": "o", "format": "avro"}, "recorded")
    assert with_registry(recorded, url).settings["registry"] == url
    assert with_registry(recorded, "") == recorded
    assert with_registry(HandlerChoice("m:f", {"format": "avro"}), url).settings == {
        "format": "avro"}


def test_the_ddl_dsn_is_never_recorded_and_added_back_for_an_evolving_sink() -> None:
    ddl = "postgresql://owner:pw@db/app"
    chosen = handler_from_flags(handler=None, settings={}, sink="table=o",
                                sink_options={"sink_evolve": "add-columns"}, ddl_dsn=ddl)
    assert chosen is not None and chosen.settings["ddl_dsn"] == ddl
    recorded = record_of(chosen.spec, chosen.settings)
    assert recorded == {"spec": SINK_HANDLER, "settings": {"table": "o",
                                                           "evolve": "add-columns"},
                        "redacted": []}
    back = HandlerChoice(SINK_HANDLER, recorded["settings"], "recorded")
    assert with_registry(back, "", ddl).settings["ddl_dsn"] == ddl
    still = HandlerChoice(SINK_HANDLER, {"table": "o"}, "recorded")
    assert with_registry(still, "", ddl) == still  # not evolving: no DDL connection
