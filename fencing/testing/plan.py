"""The handler test kit's pure half: which faults hit which batches, and what counts as a
difference between the clean application and the faulty one.

Rules
- ``plan`` cuts one partition's records into batches of seeded random sizes (so the faulty
  run splits the records differently from the clean run) and gives the batches the faults of
  ``faults`` in turn, a fault-free batch after each round; the same seed gives the same plan.
- A snapshot is ``{table: sorted rows}`` (each row one canonical text); ``diff`` names every
  table whose rows differ, with a few rows found only on either side.
- ``unstable_verdicts`` names every record whose verdicts were not all the same across the
  clean run and every attempt of the faulty run (aborted attempts included).
- Nothing here does I/O.
"""

from __future__ import annotations

import enum
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fencing.types import SourceRecord

__all__ = ["ALL_FAULTS", "Fault", "Snapshot", "Step", "diff", "plan", "unstable_verdicts"]

Snapshot = Mapping[str, Sequence[str]]


class Fault(enum.Enum):
    """What happens to one batch of the faulty run."""

    NONE = "none"
    """No fault: the batch commits."""
    ABORT = "abort"
    """The handler runs, then its transaction rolls back; the batch is retried."""
    LOST_REPLY_COMMITTED = "lost-reply-committed"
    """COMMIT is applied and its reply lost on the wire."""
    LOST_REPLY_NOT_COMMITTED = "lost-reply-not-committed"
    """COMMIT is lost before the server sees it."""
    REPLAY_NEW_EPOCH = "replay-new-epoch"
    """The handler runs and rolls back, a new owner claims (epoch + 1), the old token is
    refused, and the batch is replayed in two smaller batches."""


ALL_FAULTS = (Fault.ABORT, Fault.LOST_REPLY_COMMITTED, Fault.LOST_REPLY_NOT_COMMITTED,
              Fault.REPLAY_NEW_EPOCH)


@dataclass(frozen=True, slots=True)
class Step:
    """One batch of the faulty run and the fault injected into it."""

    records: tuple[SourceRecord, ...]
    fault: Fault


def plan(records: Sequence[SourceRecord], *, rng: random.Random,
         faults: Sequence[Fault] = ALL_FAULTS, first: int = 0,
         max_batch: int = 50) -> list[Step]:
    """The steps of one partition; ``first``: where in the fault rotation it starts."""
    cycle = [*faults, Fault.NONE]
    steps: list[Step] = []
    pos = 0
    upper = max(1, min(max_batch, len(records) // (len(cycle) + 1) or 1))
    while pos < len(records):
        n = rng.randint(1, upper)
        fault = cycle[(first + len(steps)) % len(cycle)]
        steps.append(Step(tuple(records[pos:pos + n]), fault))
        pos += n
    return steps


def diff(clean: Snapshot, faulty: Snapshot, *, shown: int = 3,
         labels: tuple[str, str] = ("in the clean application", "after the faults")) -> list[str]:
    """One line per table whose rows differ between the two snapshots (``labels`` name them)."""
    out = []
    for table in sorted(set(clean) | set(faulty)):
        a, b = Counter(clean.get(table, ())), Counter(faulty.get(table, ()))
        if a == b:
            continue
        only_clean = list((a - b).elements())
        only_faulty = list((b - a).elements())
        out.append(f"table {table}: {len(only_clean)} row(s) only {labels[0]} "
                   f"{only_clean[:shown]}, {len(only_faulty)} only {labels[1]} "
                   f"{only_faulty[:shown]}")
    return out


def unstable_verdicts(seen: Mapping[tuple[str, int, int], Sequence[str]]) -> list[str]:
    """One line per record (topic, partition, offset) whose verdicts differ."""
    return [f"record {t}[{p}]@{o}: verdicts differ across attempts: {sorted(set(v))}"
            for (t, p, o), v in sorted(seen.items()) if len(set(v)) > 1]
