"""The pure lane decisions (``fencing.lanes``): stable lanes by key, spans that cover Kafka's
gaps, the completion set's effective frontier, and what a successor skips."""

from __future__ import annotations

import random

import pytest

import fencing.lanes as lanes_module
from fencing.lanes import Completion, Dispatch, lane_of, merge_spans
from fencing.types import SourceRecord


def rec(offset: int, key: bytes | None = b"k") -> SourceRecord:
    return SourceRecord("t", 0, offset, key, b"v")


def test_lane_of_is_stable_and_keeps_null_keys_together_unless_asked() -> None:
    assert lane_of(b"order-17", 8) == lane_of(b"order-17", 8) == 4  # CRC-32, not hash()
    assert {lane_of(b"k%d" % i, 8) for i in range(200)} == set(range(8))
    assert {lane_of(None, 8, offset=o) for o in range(20)} == {0}
    assert {lane_of(None, 8, offset=o, null_any=True) for o in range(20)} == set(range(8))
    assert lane_of(b"x", 1) == 0
    with pytest.raises(ValueError):
        lane_of(b"x", 0)


def test_merge_spans() -> None:
    assert merge_spans([(5, 6), (0, 1), (2, 3), (9, 9), (8, 8)]) == ((0, 3), (5, 6), (8, 9))
    with pytest.raises(ValueError):
        merge_spans([(3, 2)])


def test_completion_frontier_done_and_fold() -> None:
    c = Completion.of(10, [(3, 4), (12, 12), (10, 10), (14, 15)])
    assert c.spans == ((10, 10), (12, 12), (14, 15)) and c.frontier == 11
    assert [o for o in range(8, 18) if c.done(o)] == [8, 9, 10, 12, 14, 15]
    c = c.with_spans([(11, 11)])
    assert c.frontier == 13 and c.above == 3
    assert c.fold() == Completion(13, ((14, 15),))
    assert Completion(7).frontier == 7 and Completion(7).above == 0


def test_dispatch_spans_cover_gaps_and_the_window_holds_back() -> None:
    d = Dispatch(Completion(100), 4, window=6)
    taken, used = d.take([rec(99), rec(100, b"a"), rec(103, b"b"), rec(104, b"a"),
                          rec(106, b"c"), rec(107, b"a")])
    assert used == 5  # 99 is below the frontier; 106's span starts at 105 < 100 + 6
    assert [(r.offset, span) for _, r, span in taken] == [(100, (100, 100)), (103, (101, 103)),
                                                          (104, (104, 104)), (106, (105, 106))]
    lanes = {r.key: lane for lane, r, _ in taken}
    assert lanes[b"a"] == lane_of(b"a", 4)
    assert d.applied([(101, 103)]) == 100  # 100 not applied yet: the frontier stays
    assert d.applied([(100, 100)]) == 104
    taken, used = d.take([rec(107, b"a")])
    assert used == 1 and [span for _, _, span in taken] == [(107, 107)]


def test_a_gap_wider_than_the_window_lets_its_next_record_through() -> None:
    d = Dispatch(Completion(17), 2, window=5)
    taken, used = d.take([rec(23), rec(24)])
    assert used == 1 and [span for _, _, span in taken] == [(17, 23)]
    assert d.applied([(17, 23)]) == 24
    assert [span for _, _, span in d.take([rec(24)])[0]] == [(24, 24)]


def test_dispatch_skips_what_a_predecessor_applied() -> None:
    d = Dispatch(Completion.of(0, [(2, 3), (6, 6)]), 2, window=100)
    taken, used = d.take([rec(o) for o in range(8)])
    assert used == 8 and [r.offset for _, r, _ in taken] == [0, 1, 4, 5, 7]


def lives(seed: int) -> list[str]:
    """Records with gaps and random keys; lifetimes apply random lane batches in random
    interleavings and die at random points (whatever a lane had not committed is lost);
    each successor starts from the durable completion set. The problems found: a record
    applied twice or never, a key's records out of offset order."""
    rng = random.Random(seed)
    offsets = sorted(rng.sample(range(300), 120))
    records = [rec(o, None if rng.random() < 0.1 else b"key%d" % rng.randrange(12))
               for o in offsets]
    lanes, window = rng.choice([2, 4, 8]), rng.choice([5, 20, 400])
    durable = Completion(0)
    applied: list[SourceRecord] = []
    problems: list[str] = []
    for _life in range(500):
        if durable.frontier > offsets[-1]:
            break
        d = Dispatch(durable.fold() if rng.random() < 0.5 else durable, lanes, window=window,
                     null_any=rng.random() < 0.5)
        queues: dict[int, list[tuple[SourceRecord, tuple[int, int]]]] = {}
        pending = [r for r in records if r.offset >= d.completion.frontier]
        for _ in range(rng.randrange(1, 30)):
            taken, used = d.take(pending)
            pending = pending[used:]
            for lane, r, span in taken:
                queues.setdefault(lane, []).append((r, span))
            busy = [lane for lane, q in queues.items() if q]
            if not busy:
                if not pending:
                    break
                continue
            lane = rng.choice(busy)
            n = rng.randrange(1, len(queues[lane]) + 1)
            batch, queues[lane] = queues[lane][:n], queues[lane][n:]
            applied.extend(r for r, _ in batch)  # the lane's transaction commits
            spans = [s for _, s in batch]
            durable = durable.with_spans(spans)
            d.applied(spans)
    else:
        problems.append("no progress")
    got = sorted(r.offset for r in applied)
    if got != offsets:
        twice = sorted({o for o in got if got.count(o) > 1})
        never = sorted(set(offsets) - set(got))
        problems.append(f"applied twice {twice[:5]}, never {never[:5]}")
    last: dict[bytes | None, int] = {}
    for r in applied:  # in apply order: a key's records never overtake each other
        if r.key is not None and r.offset < last.get(r.key, -1):
            problems.append(f"key {r.key!r}: {r.offset} after {last[r.key]}")
        if r.key is not None:
            last[r.key] = max(r.offset, last.get(r.key, -1))
    return problems


@pytest.mark.parametrize("seed", range(40))
def test_random_lives_apply_every_record_once_in_key_order(seed: int) -> None:
    assert lives(seed) == []


def _done_ignoring_spans(self: Completion, offset: int) -> bool:
    return offset < self.base


def _frontier_past_unfinished(self: Completion) -> int:
    return self.spans[-1][1] + 1 if self.spans else self.base


def _lane_by_offset(key: bytes | None, lanes: int, *, offset: int = 0,
                    null_any: bool = False) -> int:
    return offset % lanes


@pytest.mark.parametrize(("name", "attr", "value"), [
    ("a successor ignores the completion set", "Completion.done", _done_ignoring_spans),
    ("the frontier moves past an unfinished lane", "Completion.frontier",
     property(_frontier_past_unfinished)),
    ("a lane overtakes its key", "lane_of", _lane_by_offset),
])
def test_each_mutant_is_killed_by_the_randomized_lives(monkeypatch: pytest.MonkeyPatch,
                                                       name: str, attr: str,
                                                       value: object) -> None:
    """Each rule broken on purpose: some of the 40 randomized lives find it."""
    owner, _, field = attr.rpartition(".")
    target = getattr(lanes_module, owner) if owner else lanes_module
    monkeypatch.setattr(target, field, value)
    killed = [seed for seed in range(40) if lives(seed)]
    assert killed, f"mutant not killed: {name}"
