"""The order of a batch's table operations (pure, no I/O).

Rules
- ``sets_then_rest`` splits a batch's operations (``rows.Upsert``/``rows.Delete``) into
  sets — a key's n-th operation in set n, so no key repeats within a set and the order
  inside one does not matter to a key's rows — while a set is large enough to be worth a
  set statement, then the rest of the operations in their order. Applying the sets one
  after another, then the rest one by one, applies every operation in order. The table
  sink writes this way (``fencing.postgres.sink.table``): every record meets the table's
  checks in order.
- ``last_wins`` keeps per key only the last operation (what a sink that skips superseded
  records would write); ``python -m ops.bench.sink --in-order`` measures the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fencing.postgres.sink.rows import Delete, Patch, Upsert

__all__ = ["last_wins", "sets_then_rest"]

Op = Upsert | Patch | Delete


def sets_then_rest(ops: Sequence[Op], *, min_set: int) -> tuple[list[list[Op]], list[Op]]:
    """``ops`` as sets to apply one after another (a key's n-th operation in set n; none
    repeats a key), as long as a set holds at least ``min_set`` operations (the first one
    always), then the operations of the later sets in their order (module Rules)."""
    nth: list[int] = []
    seen: dict[Any, int] = {}
    sizes: list[int] = []
    for op in ops:
        n = seen.get(op.key, 0)
        seen[op.key] = n + 1
        nth.append(n)
        if n == len(sizes):
            sizes.append(0)
        sizes[n] += 1
    k = next((i for i, size in enumerate(sizes) if i and size < min_set), len(sizes))
    sets: list[list[Op]] = [[] for _ in range(k)]
    rest: list[Op] = []
    for op, n in zip(ops, nth, strict=True):
        (sets[n] if n < k else rest).append(op)
    return sets, rest


def last_wins(ops: Sequence[Op]) -> list[Op]:
    """Per key the last operation, in the order of their last occurrence."""
    last: dict[Any, Op] = {}
    for op in ops:
        last.pop(op.key, None)
        last[op.key] = op
    return list(last.values())
