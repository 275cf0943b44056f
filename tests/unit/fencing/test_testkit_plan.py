"""The handler test kit's pure half: fault plans, snapshot diffs, verdict stability, and
records without Kafka."""

from __future__ import annotations

import random

from fencing.testing import ALL_FAULTS, Fault, json_records
from fencing.testing.plan import diff, plan, unstable_verdicts
from fencing.types import SourceRecord


def records(n: int) -> list[SourceRecord]:
    return [SourceRecord("t", 0, o, None, b"{}") for o in range(n)]


def test_a_plan_covers_every_record_once_in_order_and_rotates_the_faults() -> None:
    steps = plan(records(200), rng=random.Random(1))
    assert [r.offset for s in steps for r in s.records] == list(range(200))
    cycle = [*ALL_FAULTS, Fault.NONE]
    assert [s.fault for s in steps] == [cycle[i % len(cycle)] for i in range(len(steps))]
    assert len({len(s.records) for s in steps}) > 1  # re-split: sizes vary


def test_the_same_seed_gives_the_same_plan() -> None:
    a = plan(records(100), rng=random.Random(4), first=2)
    assert a == plan(records(100), rng=random.Random(4), first=2)
    assert a != plan(records(100), rng=random.Random(5), first=2)


def test_few_records_still_get_one_record_batches() -> None:
    steps = plan(records(3), rng=random.Random(0), faults=[Fault.ABORT])
    assert [len(s.records) for s in steps] == [1, 1, 1]
    assert [s.fault for s in steps] == [Fault.ABORT, Fault.NONE, Fault.ABORT]


def test_diff_names_the_tables_and_rows_that_differ() -> None:
    assert diff({"t": ["a", "b"]}, {"t": ["b", "a"]}) == []
    lines = diff({"t": ["a"], "u": ["x"]}, {"t": ["a", "a"]})
    assert lines == ["table t: 0 row(s) only in the clean application [], 1 only after the "
                     "faults ['a']",
                     "table u: 1 row(s) only in the clean application ['x'], 0 only after the "
                     "faults []"]


def test_unstable_verdicts_are_named() -> None:
    seen = {("t", 0, 1): ["accept", "accept"], ("t", 0, 2): ["accept", "reject: x"]}
    assert unstable_verdicts(seen) == [
        "record t[0]@2: verdicts differ across attempts: ['accept', 'reject: x']"]


def test_json_records_partition_by_key_and_count_offsets_per_partition() -> None:
    recs = json_records("orders", [("a", {"n": 1}), ("b", {"n": 2}), ("a", None)], partitions=4)
    assert recs[0].partition == recs[2].partition
    assert [r.offset for r in recs if r.partition == recs[0].partition] == [0, 1]
    assert recs[0].value == b'{"n": 1}' and recs[2].value is None and recs[2].key == b"a"


def test_the_kit_exports_what_its_package_lists() -> None:
    import fencing.testing as kit

    assert sorted(kit.__all__) == sorted(
        ["ALL_FAULTS", "Fault", "HandlerUnsafe", "KitReport", "check_handler",
         "check_handler_async", "json_records"])
    assert all(hasattr(kit, name) for name in kit.__all__)
