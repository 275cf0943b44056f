"""The order of a batch's table operations (pure, no I/O).

Rules
- ``generations`` splits a batch's operations (``rows.Upsert``/``rows.Delete``) so that
  applying the lists one after another, each as one set, applies every operation in order:
  a key's n-th operation goes into list n, so no key repeats within a list and the order
  inside one does not matter to a key's rows. The table sink writes this way
  (``fencing.postgres.sink.table``): every record meets the table's checks in order.
- ``last_wins`` keeps per key only the last operation (what a sink that skips superseded
  records would write); ``python -m ops.bench.sink --in-order`` measures the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fencing.postgres.sink.rows import Delete, Upsert

__all__ = ["generations", "last_wins"]

Op = Upsert | Delete


def generations(ops: Sequence[Op]) -> list[list[Op]]:
    """``ops`` split into generations (see the module Rules)."""
    seen: dict[Any, int] = {}
    out: list[list[Op]] = []
    for op in ops:
        n = seen.get(op.key, 0)
        seen[op.key] = n + 1
        if n == len(out):
            out.append([])
        out[n].append(op)
    return out


def last_wins(ops: Sequence[Op]) -> list[Op]:
    """Per key the last operation, in the order of their last occurrence."""
    last: dict[Any, Op] = {}
    for op in ops:
        last.pop(op.key, None)
        last[op.key] = op
    return list(last.values())
