"""Seeded property tests: the reference handler's committed results equal the independent
oracle's fold, for both generated classes and several seeds; plus generator and oracle checks."""

from __future__ import annotations

import ast
import random
from collections import Counter
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import ops.reference.oracle as oracle_mod
from fencing.memory.store import MemoryFenceStore
from fencing.store import BatchCall
from fencing.types import ClaimRequest, Reject, SourceRecord, TopicPartition
from ops.reference import generate, memory_ref_handler, partition_for, to_source_records
from ops.reference.oracle import Expected, check, diff, fold, outbox_problems
from ops.reference.snapshot import memory_state, memory_store_state

SEEDS = (1, 2, 3, 4, 5)
PARTITIONS = 4


class CowTx:
    """Minimal copy-on-write transaction: what the handler needs from the memory store."""

    def __init__(self, base: dict[str, dict[Any, Any]]) -> None:
        self.base, self.changed = base, {}  # type: dict[str, dict[Any, Any]], dict[str, dict[Any, Any]]

    def table(self, name: str) -> MutableMapping[Any, Any]:
        if name not in self.changed:
            self.changed[name] = dict(self.base.get(name, {}))
        return self.changed[name]


async def apply_batch(tables: dict[str, dict[Any, Any]],
                      quarantine: dict[tuple[str, int, int], str],
                      batch: Sequence[SourceRecord]) -> None:
    """Run the memory handler over ``batch`` and commit its tables and rejects (no fence)."""
    tx = CowTx(tables)
    verdicts = await memory_ref_handler(tx, batch)
    tables.update(tx.changed)
    for r, v in zip(batch, verdicts, strict=True):
        if isinstance(v, Reject):
            quarantine[(r.topic, r.partition, r.offset)] = v.reason


def batches(records: Sequence[SourceRecord], rng: random.Random) -> list[list[SourceRecord]]:
    """Per-partition batches of varied sizes (1..200), partitions interleaved at random."""
    per: dict[int, list[SourceRecord]] = {}
    for r in records:
        per.setdefault(r.partition, []).append(r)
    queues: dict[int, list[list[SourceRecord]]] = {}
    for p, recs in per.items():
        i, out = 0, []
        while i < len(recs):
            n = rng.choice((1, 2, 7, 50, 200))
            out.append(recs[i : i + n])
            i += n
        queues[p] = out
    order: list[list[SourceRecord]] = []
    while queues:
        p = rng.choice(sorted(queues))
        order.append(queues[p].pop(0))
        if not queues[p]:
            del queues[p]
    return order


def source(seed: int, klass: str, count: int = 3000) -> list[SourceRecord]:
    return to_source_records(
        generate(seed, count=count, partitions=PARTITIONS, klass=klass, topic="ledger")  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("klass", ["valid", "conflict"])
@pytest.mark.parametrize("seed", SEEDS)
async def test_memory_handler_equals_oracle(seed: int, klass: str) -> None:
    src = source(seed, klass)
    tables: dict[str, dict[Any, Any]] = {}
    quarantine: dict[tuple[str, int, int], str] = {}
    for batch in batches(src, random.Random(seed * 7919)):
        await apply_batch(tables, quarantine, batch)
    expected = fold(src)
    actual = memory_state(tables, quarantine)
    assert diff(expected, actual) == []
    assert outbox_problems(actual) == []
    if klass == "valid":
        assert not expected.quarantine and len(expected.outbox) == len(src)
    else:
        assert 0.2 * len(src) < len(expected.quarantine) < 0.6 * len(src)


@pytest.mark.parametrize("klass", ["valid", "conflict"])
@pytest.mark.parametrize("seed", (11, 12, 13))
async def test_memory_store_prefixes_match_oracle(seed: int, klass: str) -> None:
    """Through the in-memory fence store: after every batch, committed state equals the
    oracle's fold of the source prefix below the frontiers."""
    src = source(seed, klass, count=1200)
    store = MemoryFenceStore("g")
    tps = [TopicPartition("ledger", p) for p in range(PARTITIONS)]
    tokens = dict(await store.claim([ClaimRequest(tp, 0) for tp in tps], lifetime="L1"))
    for n, batch in enumerate(batches(src, random.Random(seed))):
        tp = batch[0].tp
        tokens[tp] = await store.process(BatchCall(tp, batch, memory_ref_handler), tokens[tp])
        if n % 5 == 0:
            frontiers = {(t.topic, t.partition): tok.frontier for t, tok in tokens.items()}
            assert check(src, frontiers, memory_store_state(store)) == []
    frontiers = {(t.topic, t.partition): tok.frontier for t, tok in tokens.items()}
    assert all(f == sum(1 for r in src if r.partition == p) for (_, p), f in frontiers.items())
    assert check(src, frontiers, memory_store_state(store)) == []


async def test_double_application_is_detected() -> None:
    """Applying one batch twice (what the fence prevents) is caught by ``check``."""
    src = [r for r in source(5, "valid", count=400) if r.partition == 0]
    tables: dict[str, dict[Any, Any]] = {}
    quarantine: dict[tuple[str, int, int], str] = {}
    for batch in (src[:50], src[50:], src[50:60]):
        await apply_batch(tables, quarantine, batch)
    problems = check(src, {("ledger", 0): len(src)}, memory_state(tables, quarantine))
    assert len([p for p in problems if p.startswith("quarantine[")]) == 10


def test_check_reports_missing_and_extra_rows() -> None:
    src = source(3, "valid", count=200)
    exp = fold(src)
    frontiers = {("ledger", p): 10**9 for p in range(PARTITIONS)}
    ob = dict(exp.outbox)
    dropped = next(iter(ob))
    del ob[dropped]
    problems = check(src, frontiers, Expected(exp.documents, ob, exp.quarantine))
    assert any("not 1.." in p or "disagrees" in p for p in problems)
    assert any(p.startswith(f"outbox[{dropped!r}]") for p in problems)
    early = {("ledger", p): 0 for p in range(PARTITIONS)}
    assert any("not below" in p for p in check(src, early, exp))


def test_generator_is_deterministic_and_keyed() -> None:
    a = generate(9, count=500, partitions=6, klass="conflict", topic="t")
    b = generate(9, count=500, partitions=6, klass="conflict", topic="t")
    c = generate(10, count=500, partitions=6, klass="conflict", topic="t")
    assert a == b and a != c and len(a) == 500
    assert all(r.partition == partition_for(r.key, 6) for r in a)
    assert {r.partition for r in a} == set(range(6))
    state = random.getstate()
    generate(9, count=50, partitions=6, klass="valid", topic="t")
    assert random.getstate() == state  # the global random is untouched


def test_conflict_class_covers_every_rejection() -> None:
    exp = fold(source(2, "conflict", count=5000))
    codes = Counter(
        r if r.startswith("malformed") else r.split(":")[0] for r in exp.quarantine.values()
    )
    for code in (
        "stale-revision",
        "skipped-revision",
        "missing-document",
        "withdrawn-document",
        "document-exists",
        "put-revision-not-1",
        "malformed: value is not UTF-8",
        "malformed: value is not JSON",
        "malformed: key is not UTF-8",
        "malformed: body is missing, not a string or not storable",
    ):
        assert codes[code] > 0, code


def test_fold_ignores_cross_partition_interleaving() -> None:
    src = source(4, "conflict", count=1500)
    by_partition = sorted(src, key=lambda r: (r.partition, r.offset))
    assert fold(src) == fold(by_partition)


def test_fold_refuses_ambiguous_orders() -> None:
    put = b'{"kind": "put", "rev": 1, "body": "x"}'
    with pytest.raises(ValueError, match="partitions"):
        fold([SourceRecord("t", 0, 0, b"d", put), SourceRecord("t", 1, 0, b"d", put)])
    with pytest.raises(ValueError, match="not after"):
        fold([SourceRecord("t", 0, 5, b"d", put), SourceRecord("t", 0, 5, b"e", put)])


def test_oracle_is_independent_of_the_handler() -> None:
    tree = ast.parse(Path(oracle_mod.__file__).read_text())
    imported = {
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    assert not {m for m in imported if m and m.startswith("fencing")}, imported
