"""ops.operator.status_view / ops.commands.status:
availability never shows a stale state as current."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fencing.types import SourceFacts, TopicPartition
from ops.commands.status import build_status
from ops.operator.member_view import Availability, MemberRow, classify_member
from ops.operator.status_text import render_text
from ops.operator.status_view import (
    KafkaCommitted,
    MirrorView,
    PartitionRow,
    classify_mirror,
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


def test_lanes_show_the_completion_set_and_the_owners_busy_lanes() -> None:
    """Spans above the frontier: lag from the oldest unfinished offset, the window used;
    the observed owner's member row adds its busy lanes (alone when no span is above)."""
    row = member("running", age_s=1)
    busy_row = MemberRow(row.lifetime_id, row.group_id, row.member_id, row.host, row.pid,
                         row.state, row.started_at, row.last_seen,
                         {**row.detail, "lanes_busy": {"orders[0]": 2}})
    members = {"lt-a": classify_member(busy_row, now=NOW)}
    spans = dataclasses.replace(prow(90), lane_spans=((90, 94), (97, 99)))
    v = view_partition(spans, facts=SourceFacts("id1", 0, 120), members=members)
    assert v.lag == 120 - 95 and v.lanes_busy == 2
    assert v.as_dict()["lanes"] == {"oldest_unfinished": 95, "window_used": 5,
                                    "spans_above": 1, "busy": 2}
    caught_up = view_partition(prow(90), facts=SourceFacts("id1", 0, 90), members=members)
    assert caught_up.as_dict()["lanes"] == {"oldest_unfinished": 90, "window_used": 0,
                                            "spans_above": 0, "busy": 2}
    alone = view_partition(spans, facts=SourceFacts("id1", 0, 120), members={})
    assert alone.as_dict()["lanes"]["busy"] is None  # no observed owner: not known
    assert view_partition(prow(90), facts=None, members={}).as_dict()["lanes"] is None


# ---- Kafka's committed offset beside the frontier (the offset mirror) -----------------------

def test_mirror_is_judged_by_how_long_ago_the_frontier_moved() -> None:
    def mirror(committed: KafkaCommitted | None, age_s: float) -> MirrorView:
        return classify_mirror(90, committed, updated_at=NOW,
                               now=NOW + timedelta(seconds=age_s), bound_s=30)

    assert mirror(KafkaCommitted(90), 3600) is MirrorView.IN_SYNC
    assert mirror(KafkaCommitted(80), 30) is MirrorView.CONVERGING
    assert mirror(KafkaCommitted(80), 31) is MirrorView.MISMATCH
    assert mirror(KafkaCommitted(None), 31) is MirrorView.MISMATCH  # none committed at all
    assert mirror(None, 3600) is MirrorView.UNKNOWN


def test_a_stale_kafka_offset_is_flagged_with_a_note_and_in_json() -> None:
    later = NOW + timedelta(seconds=45)
    v = view_partition(prow(5370), facts=SourceFacts("id1", 0, 5370), members={},
                       committed=KafkaCommitted(5055), now=later, mirror_warn_s=30)
    assert v.mirror is MirrorView.MISMATCH and v.lag == 0
    (note,) = [n for n in v.notes if n.startswith("offset mirror:")]
    assert "committed offset 5055" in note and "frontier is 5370" in note and "45 s ago" in note
    d = v.as_dict()
    assert (d["kafka_committed"], d["kafka_mirror"]) == (5055, "mismatch")
    fresh = view_partition(prow(5370), facts=None, members={}, committed=KafkaCommitted(5055),
                           now=NOW + timedelta(seconds=5), mirror_warn_s=30)
    assert fresh.mirror is MirrorView.CONVERGING and fresh.notes == ()


def test_status_shows_the_kafka_column_and_group_notes() -> None:
    tp0, tp1 = TopicPartition("orders", 0), TopicPartition("orders", 1)
    parts = [prow(7, owner=None),
             dataclasses.replace(prow(9, owner=None), partition=1),
             dataclasses.replace(prow(3, owner=None), group_id="other")]
    facts = {tp0: SourceFacts("id1", 0, 7), tp1: SourceFacts("id1", 0, 9)}
    status = build_status(now=NOW + timedelta(seconds=60), partitions=parts, members=[],
                          facts=facts, topic_notes={},
                          committed={("g", tp0): 7, ("g", tp1): None},
                          group_notes={"group other": "committed offsets unknown: down"},
                          mirror_warn_s=30)
    mirrors = [(p["group"], p["partition"], p["kafka_committed"], p["kafka_mirror"])
               for p in status["partitions"]]
    assert mirrors == [("g", 0, 7, "in-sync"), ("g", 1, None, "mismatch"),
                       ("other", 0, None, "unknown")]
    assert status["kafka"]["answered"] is False
    lines = render_text(status).splitlines()
    header = next(ln for ln in lines if ln.startswith("GROUP ") and "KAFKA" in ln)
    assert header.split()[4:7] == ["FRONTIER", "KAFKA", "HIGH"]
    cells = [ln.split() for ln in lines if ln.startswith(("g ", "other "))]
    assert [c[5] for c in cells[:3]] == ["7", "none", "?"] and cells[1][6] == "!"


def test_topics_sum_lag_and_owners_per_topic() -> None:
    parts = [prow(7, owner="lt-live"),
             dataclasses.replace(prow(3, owner="lt-live"), partition=1),
             dataclasses.replace(prow(0, owner=None), topic="returns")]
    status = build_status(now=NOW, partitions=parts, members=[member("running", age_s=1,
                                                                      lifetime="lt-live")],
                          facts={TopicPartition("orders", 0): SourceFacts("id1", 0, 10),
                                 TopicPartition("orders", 1): SourceFacts("id1", 0, 10)},
                          topic_notes={"returns": "Kafka did not answer"})
    assert status["topics"] == [
        {"group": "g", "topic": "orders", "partitions": 2, "owned_live": 2,
         "lag": 3 + 7, "stalled": 0},
        {"group": "g", "topic": "returns", "partitions": 1, "owned_live": 0,
         "lag": None, "stalled": 0}]
    text = render_text(status)
    assert "TOPICS" in text and "returns" in text


def test_topics_count_a_stopped_or_retired_owner_as_not_owned() -> None:
    parts = [prow(0, owner="lt-stopped"), dataclasses.replace(prow(0, owner="lt-retired"),
                                                               partition=1),
             dataclasses.replace(prow(0, owner="lt-live"), partition=2)]
    members = [member("stopped", age_s=1, lifetime="lt-stopped"),
               member("retired", age_s=1, lifetime="lt-retired"),
               member("running", age_s=1, lifetime="lt-live")]
    status = build_status(now=NOW, partitions=parts, members=members, facts={},
                          topic_notes={})
    assert status["topics"][0]["owned_live"] == 1


def test_an_operator_owned_partition_reads_as_the_operators_reset() -> None:
    row = PartitionRow("g", "t", 0, 4, 0, "operator:ann@box", "id",
                       NOW - timedelta(seconds=40))
    view = view_partition(row, facts=SourceFacts("id", 0, 20), members={},
                          committed=KafkaCommitted(20), now=NOW)
    assert view.owner_availability == "operator" and view.owner_state is None
    assert view.notes[0].startswith("reset by operator:ann@box 40 s ago (epoch 4, frontier 0):"
                                    " a running member assigned this partition claims it again")
    assert view.notes[-1] == (
        "offset mirror: Kafka has committed offset 20 for this group; the frontier is 0 since "
        "operator:ann@box's reset 40 s ago, which Kafka does not know of: the member that "
        "claims the partition next commits it")


def test_a_retrying_partition_shows_attempt_n_of_m_next_retry_and_quarantined() -> None:
    row = PartitionRow("g", "t", 0, 3, 10, "lt-a", "id", NOW, quarantined=2, attempts=2,
                       max_attempts=5, next_retry_at=NOW + timedelta(seconds=3),
                       last_error="Transient: busy")
    view = view_partition(row, facts=SourceFacts("id", 0, 20), members={})
    assert (f"retrying offset 10: attempt 2 of 5, next retry at "
            f"{(NOW + timedelta(seconds=3)).isoformat()} (last error: Transient: busy)"
            in view.notes)
    assert "2 record(s) quarantined" in view.notes
    doc = view.as_dict()
    assert doc["quarantined"] == 2 and doc["retrying"]["attempt"] == 2
    assert doc["retrying"]["max_attempts"] == 5 and doc["retrying"]["offset"] == 10
    suspect = view_partition(dataclasses.replace(row, next_retry_at=None, last_error=None,
                                                 quarantined=0, alone=1),
                             facts=None, members={})
    assert suspect.notes == ("suspect offset 10: tried alone 1 time(s) of 5 before quarantine "
                             "(earlier attempts alone did not complete: process deaths?)",)
    assert suspect.as_dict()["retrying"]["alone"] == 1
    healthy = view_partition(dataclasses.replace(row, attempts=None, quarantined=0),
                             facts=None, members={})
    assert healthy.notes == () and healthy.as_dict()["retrying"] is None


def test_quarantined_records_are_counted_by_cause_so_a_killer_tells_from_a_victim() -> None:
    row = PartitionRow("g", "t", 0, 3, 10, "lt-a", "id", NOW, quarantined=4,
                       quarantine_causes={"killed-the-process": 1, "raised": 2,
                                          "outcome-unknown": 1})
    view = view_partition(row, facts=None, members={})
    assert ("4 record(s) quarantined: 1 killed the process, 1 outcome unknown, 2 raised"
            in view.notes)
    assert view.as_dict()["quarantine_causes"] == {"killed-the-process": 1, "raised": 2,
                                                   "outcome-unknown": 1}


@pytest.mark.parametrize("durability, completeness", [
    ("durable-critical", "claimed"), ("derived-reconcilable", "claimed"),
    ("best-effort", "not-claimed"), (None, "unknown")])
def test_a_best_effort_owner_never_claims_completeness(durability: str | None,
                                                       completeness: str) -> None:
    detail = {} if durability is None else {"handler": {
        "durability": durability, "effects": "transactional", "on_failure": "quarantine"}}
    owner = classify_member(dataclasses.replace(member("running", age_s=1, lifetime="lt-a"),
                                                detail=detail), now=NOW)
    view = view_partition(PartitionRow("g", "t", 0, 3, 10, "lt-a", "id", NOW),
                          facts=SourceFacts("id", 0, 10), members={"lt-a": owner})
    doc = view.as_dict()
    assert (doc["durability"], doc["completeness"], doc["lag"]) == (durability, completeness, 0)
    claimed_note = [n for n in view.notes if "completeness is not claimed" in n]
    assert bool(claimed_note) is (completeness == "not-claimed")
    status = build_status(now=NOW, partitions=[view.row], members=[dataclasses.replace(
        member("running", age_s=1, lifetime="lt-a"), detail=detail)], facts={
        TopicPartition("t", 0): SourceFacts("id", 0, 10)}, topic_notes={})
    lag_cell = "0 (best-effort)" if completeness == "not-claimed" else "0 "
    assert lag_cell in render_text(status)


def test_a_members_ignored_fields_show_as_a_line_per_table() -> None:
    row = member("running", age_s=1, lifetime="lt-s")
    counted = MemberRow(row.lifetime_id, row.group_id, row.member_id, row.host, row.pid,
                        row.state, row.started_at, row.last_seen,
                        {**row.detail, "sink_unknown_fields": {
                            "s.orders": {"records": 7, "fields": ["color", "size"]},
                            "s.idle": {"records": 0, "fields": []}}})
    status = build_status(now=NOW, partitions=[], members=[counted, member("running", age_s=1)],
                          facts={}, topic_notes={})
    by = {m["lifetime"]: m for m in status["members"]}
    assert by["lt-s"]["sink_unknown_fields"]["s.orders"]["records"] == 7
    assert by["lt-a"]["sink_unknown_fields"] == {}
    lines = render_text(status).splitlines()
    at = lines.index(next(ln for ln in lines if ln.startswith("UNKNOWN FIELDS")))
    assert lines[at + 1:] == [
        "  g lt-s: s.orders: 7 records held fields with no column, ignored: color, size"]
    assert not any(ln.startswith("UNKNOWN FIELDS") for ln in render_text(
        build_status(now=NOW, partitions=[], members=[member("running", age_s=1)], facts={},
                     topic_notes={})).splitlines())


def test_a_members_stale_changes_show_as_a_line_per_table() -> None:
    row = member("running", age_s=1, lifetime="lt-s")
    counted = MemberRow(row.lifetime_id, row.group_id, row.member_id, row.host, row.pid,
                        row.state, row.started_at, row.last_seen,
                        {**row.detail, "sink_stale_changes": {"s.items": 3}})
    status = build_status(now=NOW, partitions=[], members=[counted, member("running", age_s=1)],
                          facts={}, topic_notes={})
    by = {m["lifetime"]: m for m in status["members"]}
    assert by["lt-s"]["sink_stale_changes"] == {"s.items": 3}
    assert by["lt-a"]["sink_stale_changes"] == {}
    lines = render_text(status).splitlines()
    at = lines.index("STALE CHANGES (table sink, --sink-version-column)")
    assert lines[at + 1:] == ["  g lt-s: s.items: 3 changes older than the stored row left alone"]
