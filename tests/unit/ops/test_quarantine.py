"""Pure parts of ``fencectl quarantine``: the replay verdict, rows back to records, flags."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

import pytest

from fencing.errors import ConfigError
from fencing.types import ACCEPT, Reject, SourceRecord
from ops.cli import build_parser
from ops.commands.quarantine import _selection, _timestamp, row_dict
from ops.operator.quarantine import Outcome, State, judge, record_of


def test_judge_accept_reject_and_error() -> None:
    assert judge([ACCEPT], None) == (Outcome.APPLIED, "accepted")
    assert judge([Reject("still bad")], None) == (Outcome.FAILED, "still bad")
    outcome, reason = judge(None, ValueError("boom"))
    assert outcome is Outcome.FAILED
    assert reason == "replay: handler raised ValueError: boom"


def _row(**over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "group_id": "g", "topic": "t", "partition": 2, "offset": 7, "key": b"k",
        "value": b"\xff\x00", "headers": '[["h", "dg=="], ["n", null]]', "reason": "bad",
        "epoch": 3, "at": datetime(2026, 1, 1, tzinfo=UTC), "state": "quarantined",
        "replays": 0, "replayed_by": None, "replayed_at": None, "replay_result": None}
    row.update(over)
    return row


def test_record_of_restores_what_the_handler_saw() -> None:
    assert record_of(_row()) == SourceRecord("t", 2, 7, b"k", b"\xff\x00",
                                             (("h", b"v"), ("n", None)), None)


def test_row_dict_renders_bytes_as_text_or_base64() -> None:
    shown = row_dict(_row())
    assert shown["key"] == {"text": "k", "base64": None}
    assert shown["value"] == {"text": None, "base64": "/wA="}
    assert shown["headers"] == [{"key": "h", "base64": "dg=="}, {"key": "n", "base64": None}]
    assert shown["quarantined_at"] == "2026-01-01T00:00:00+00:00"


def test_timestamp_without_zone_is_utc() -> None:
    assert _timestamp("2026-02-03T04:05:06") == datetime(2026, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert _timestamp("2026-02-03T04:05:06Z").tzinfo is not None
    with pytest.raises(argparse.ArgumentTypeError):
        _timestamp("yesterday")


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["quarantine", *argv])


def test_selection_defaults_and_refusals() -> None:
    sel = _selection(_args("list"))
    assert (sel.group_id, sel.state) == (None, State.QUARANTINED)
    assert _selection(_args("list", "--state", "all")).state is None
    replay = _selection(_args("replay", "--group", "g", "--topic", "t", "--partition", "0",
                              "--offset", "4", "--offset", "9"))
    assert (replay.offsets, replay.state) == ((4, 9), State.QUARANTINED)
    assert _selection(_args("show", "--group", "g", "--topic", "t", "--partition", "1",
                            "--offset", "3")).offsets == (3,)
    with pytest.raises(ConfigError, match="--offset needs --topic and --partition"):
        _selection(_args("replay", "--group", "g", "--offset", "4"))
    with pytest.raises(ConfigError, match="--limit"):
        _selection(_args("replay", "--group", "g", "--limit", "0"))


@pytest.mark.parametrize("argv", [["replay"], ["purge", "--group", "g"], ["show", "--group", "g"]])
def test_required_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        _args(*argv)
