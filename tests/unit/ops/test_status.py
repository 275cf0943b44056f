"""ops.operator.status_view / ops.commands.status:
availability never shows a stale state as current."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fencing.types import SourceFacts, TopicPartition
from ops.commands.status import build_status, render_text
from ops.operator.status_view import (
    Availability,
    MemberRow,
    PartitionRow,
    classify_member,
    view_partition,
)

NOW = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)


def member(state: str, *, age_s: float, bound_s: float | None = 15.0,
           lifetime: str = "lt-a") -> MemberRow:
    detail: dict[str, Any] = {} if bound_s is None else {"unavailable_after_s": bound_s}
    return MemberRow(lifetime, "g", "rdkafka-1", "host", 10, state,
                     NOW - timedelta(hours=1), NOW - timedelta(seconds=age_s), detail)


def test_recent_heartbeat_is_observed_with_its_state() -> None:
    view = classify_member(member("running", age_s=14.9), now=NOW)
    assert view.availability is Availability.OBSERVED
    assert view.state == "running" and view.last_observed is None


def test_stale_heartbeat_is_unavailable_and_keeps_state_out_of_the_current_field() -> None:
    row = member("running", age_s=15.1)
    view = classify_member(row, now=NOW)
    assert view.availability is Availability.UNAVAILABLE
    assert view.state is None
    assert view.last_observed == ("running", row.last_seen)
    d = view.as_dict()
    assert d["state"] is None and d["availability"] == "unavailable"
    assert d["last_observed"] == {"state": "running", "at": row.last_seen.isoformat()}


@pytest.mark.parametrize("state", ["stopped", "retired"])
def test_final_states_stay_observed_at_any_age(state: str) -> None:
    view = classify_member(member(state, age_s=86_400), now=NOW)
    assert (view.availability, view.state, view.last_observed) == \
        (Availability.OBSERVED, state, None)


def test_each_row_carries_its_own_bound_else_the_default() -> None:
    assert classify_member(member("running", age_s=50, bound_s=60), now=NOW).state == "running"
    assert classify_member(member("running", age_s=20, bound_s=None), now=NOW,
                           default_bound_s=30).state == "running"
    assert classify_member(member("running", age_s=31, bound_s=None), now=NOW,
                           default_bound_s=30).state is None


def test_a_last_seen_in_the_future_counts_as_now() -> None:
    view = classify_member(member("waiting", age_s=-3), now=NOW)
    assert view.last_seen_age_s == 0.0 and view.state == "waiting"


def prow(frontier: int, *, owner: str | None = "lt-a",
         topic_id: str | None = "id1") -> PartitionRow:
    return PartitionRow("g", "orders", 0, 4, frontier, owner, topic_id, NOW)


def test_partition_lag_and_notes() -> None:
    members = {"lt-a": classify_member(member("running", age_s=1), now=NOW)}
    v = view_partition(prow(90), facts=SourceFacts("id1", 0, 100), members=members)
    assert (v.lag, v.notes, v.owner_availability, v.owner_state) == (10, (), "observed", "running")
    gap = view_partition(prow(5), facts=SourceFacts("id1", 20, 100), members=members)
    assert gap.lag == 95 and "retention gap" in gap.notes[0]
    recreated = view_partition(prow(90), facts=SourceFacts("id2", 0, 3), members={})
    assert recreated.lag == 0
    assert any("above the high watermark" in n for n in recreated.notes)
    assert any("recreated topic" in n for n in recreated.notes)
    assert recreated.owner_availability == "unknown" and recreated.owner_state is None
    unknown = view_partition(prow(90, owner=None), facts=None, members={}, source_note="down")
    assert (unknown.lag, unknown.high_watermark, unknown.notes) == (None, None, ("down",))


def test_build_status_and_text_show_live_and_unavailable_members() -> None:
    rows = [member("running", age_s=2, lifetime="lt-live"),
            member("running", age_s=40, lifetime="lt-dead")]
    parts = [prow(7, owner="lt-live")]
    status = build_status(now=NOW, partitions=parts, members=rows,
                          facts={TopicPartition("orders", 0): SourceFacts("id1", 0, 10)},
                          topic_notes={})
    by = {m["lifetime"]: m for m in status["members"]}
    assert by["lt-live"]["availability"] == "observed" and by["lt-live"]["state"] == "running"
    assert by["lt-dead"]["availability"] == "unavailable" and by["lt-dead"]["state"] is None
    assert by["lt-dead"]["last_observed"]["state"] == "running"
    (p,) = status["partitions"]
    assert (p["epoch"], p["frontier"], p["high_watermark"], p["lag"]) == (4, 7, 10, 3)
    assert status["kafka"] == {"answered": True, "notes": {}}
    text = render_text(status)
    assert "lt-dead" in text and "unavailable" in text and "running at" in text
    assert "observed/running" in text


def test_partition_stalled_by_its_observed_owner_is_shown_stalled() -> None:
    row = member("running", age_s=1)
    stalled_row = MemberRow(row.lifetime_id, row.group_id, row.member_id, row.host, row.pid,
                            row.state, row.started_at, row.last_seen,
                            {**row.detail, "stalled": ["orders[0]"]})
    members = {"lt-a": classify_member(stalled_row, now=NOW)}
    v = view_partition(prow(90), facts=SourceFacts("id1", 0, 100), members=members)
    assert v.stalled and v.owner_state == "running/stalled"
    assert any(n.startswith("stalled:") for n in v.notes) and v.as_dict()["stalled"] is True
    gone = {"lt-a": classify_member(dataclasses.replace(
        stalled_row, last_seen=NOW - timedelta(seconds=60)), now=NOW)}
    v = view_partition(prow(90), facts=SourceFacts("id1", 0, 100), members=gone)
    assert not v.stalled  # an unavailable owner's last report is not a current state
