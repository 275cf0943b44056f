"""Each family's source and oracle (``tests.crash.families``).

Rules
- A source is fixed by its seed: the records to produce and what they must fold to.
- ``sink``: the table equals the fold of the stream (last upsert per key wins, a tombstone
  deletes, each row carries the offset of the record that wrote it) and the quarantine holds
  exactly the records the table refuses (``tests.integration.sink_churn``).
- ``failures``: every non-poison record applied exactly once (the handler's ``applied``
  table counts applications per offset), every poison record quarantined exactly once
  with its ``ValueError`` and never applied.
- ``uncertain``: at most one external effect per record (the handler's ``external`` table,
  written on its own connection before the transaction); every record applied exactly once
  or quarantined exactly once as outcome unknown, never both.
- ``counts_problems`` is the pure comparison of applications per offset with the expected
  ones; the replay and reset families use it with their own expectations.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ops.reference.generate import GeneratedRecord
from tests.integration.sink_churn import ACCOUNT_TABLE, Script, script

__all__ = [
    "FAIL_PARTITIONS",
    "FAIL_RECORDS",
    "POISON",
    "SINK_TABLE",
    "TRANSIENT",
    "UNCERTAIN_FLAGS",
    "applied_counts",
    "counts_problems",
    "failing_flags",
    "failing_records",
    "failures_problems",
    "quarantined",
    "sink_problems",
    "sink_records",
    "sink_setup",
    "uncertain_problems",
]

SINK_TABLE = "acct"
FAIL_PARTITIONS, FAIL_RECORDS = 3, 400  # per partition
TRANSIENT = ((0, 45), (1, 85), (2, 125))  # each fails once, transiently
POISON = ((0, 130), (1, 210), (2, 290))  # each raises ValueError, always


def sink_records(topic: str, *, count: int, partitions: int) -> tuple[list[GeneratedRecord],
                                                                      Script]:
    plan = script(topic, count=count, partitions=partitions, keys=60, fmt="json")
    return plan.records, plan


async def sink_setup(conn: Any, schema: str) -> None:
    await conn.execute(f'CREATE TABLE "{schema}".{SINK_TABLE} {ACCOUNT_TABLE}')


async def sink_problems(conn: Any, schema: str, group: str, plan: Script) -> list[str]:
    rows = await conn.fetch(f'SELECT id, name, amount, tags, updated FROM "{schema}".'
                            f"{SINK_TABLE}")
    table = {r["id"]: (r["name"], r["amount"], json.loads(r["tags"]), r["updated"])
             for r in rows}
    held = sorted(await quarantined(conn, schema, group))
    problems = []
    if held != sorted(plan.unfit):
        problems.append(f"quarantine {len(held)} rows, expected the {len(plan.unfit)} unfit "
                        f"records: extra {sorted(set(held) - plan.unfit)[:5]}, missing "
                        f"{sorted(plan.unfit - set(held))[:5]}")
    missing, extra = plan.table.keys() - table.keys(), table.keys() - plan.table.keys()
    wrong = sorted(k for k in plan.table.keys() & table.keys() if plan.table[k] != table[k])
    if missing or extra or wrong:
        problems.append(f"table is not the fold: missing keys {sorted(missing)[:5]}, extra "
                        f"{sorted(extra)[:5]}, wrong {wrong[:5]}")
    return problems


def failing_records(topic: str) -> list[GeneratedRecord]:
    return [GeneratedRecord(topic, p, f"k{o}".encode(), f"v{o}".encode())
            for o in range(FAIL_RECORDS) for p in range(FAIL_PARTITIONS)]


def _at(points: tuple[tuple[int, int], ...]) -> str:
    return ",".join(f"{p}:{o}" for p, o in points)


def failing_flags(*, poison: tuple[tuple[int, int], ...] = POISON,
                  transient: tuple[tuple[int, int], ...] = TRANSIENT) -> tuple[str, ...]:
    """``fencectl`` flags of ``tests.integration.handlers:failing_handler`` failing at
    ``transient`` (once) and ``poison`` (always)."""
    return ("--handler", "tests.integration.handlers:failing_handler",
            "--handler-setting", f"transient={_at(transient)}",
            "--handler-setting", "transient_times=1",
            "--handler-setting", f"poison={_at(poison)}",
            "--retry-initial-ms", "50", "--retry-max-ms", "200")


async def applied_counts(conn: Any, schema: str, topic: str) -> dict[tuple[int, int], int]:
    rows = await conn.fetch(f'SELECT partition, "offset", n FROM "{schema}".applied'
                            " WHERE topic = $1", topic)
    return {(r["partition"], r["offset"]): r["n"] for r in rows}


async def quarantined(conn: Any, schema: str, group: str) -> list[tuple[int, int]]:
    rows = await conn.fetch(f'SELECT partition, "offset" FROM "{schema}".quarantine'
                            " WHERE group_id = $1", group)
    return [(r["partition"], r["offset"]) for r in rows]


def counts_problems(got: Mapping[tuple[int, int], int],
                    expected: Mapping[tuple[int, int], int]) -> list[str]:
    """Applications per (partition, offset) against the expected ones (absent: 0)."""
    wrong = sorted((k, got.get(k, 0), n) for k, n in expected.items() if got.get(k, 0) != n)
    wrong += sorted((k, n, 0) for k, n in got.items() if k not in expected and n)
    if not wrong:
        return []
    return [f"{len(wrong)} records applied a wrong number of times ((partition, offset), "
            f"applied, expected): {wrong[:6]}"]


async def failures_problems(conn: Any, schema: str, group: str, topic: str) -> list[str]:
    expected = {(p, o): 1 for p in range(FAIL_PARTITIONS) for o in range(FAIL_RECORDS)
                if (p, o) not in POISON}
    problems = counts_problems(await applied_counts(conn, schema, topic), expected)
    rows = await conn.fetch(f'SELECT partition, "offset", reason FROM "{schema}".quarantine'
                            " WHERE group_id = $1", group)
    held = sorted((r["partition"], r["offset"]) for r in rows)
    if held != sorted(POISON):
        problems.append(f"quarantine holds {held}, expected each poison record once: "
                        f"{sorted(POISON)}")
    problems += [f"quarantine {r['partition']}@{r['offset']}: reason {r['reason']!r} does not "
                 "name the ValueError" for r in rows if "ValueError" not in r["reason"]]
    return problems


UNCERTAIN_FLAGS = ("--handler", "tests.integration.handlers:uncertain_handler")


async def uncertain_problems(conn: Any, schema: str, group: str, topic: str) -> list[str]:
    """At most one external effect per record; a record is applied exactly once or, left
    in flight by a dead owner, quarantined exactly once (outcome unknown) and never
    applied."""
    every = {(p, o) for p in range(FAIL_PARTITIONS) for o in range(FAIL_RECORDS)}
    rows = await conn.fetch(f'SELECT partition, "offset", n FROM "{schema}".external'
                            " WHERE topic = $1", topic)
    external = {(r["partition"], r["offset"]): r["n"] for r in rows}
    problems = [f"{len(twice)} records with more than one external effect: {twice[:6]}"
                for twice in [sorted(k for k, n in external.items() if n > 1)] if twice]
    reasons = {(r["partition"], r["offset"]): r["reason"] for r in await conn.fetch(
        f'SELECT partition, "offset", reason FROM "{schema}".quarantine WHERE group_id = $1',
        group)}
    held = set(reasons)
    problems += [f"quarantine {k}: reason {v!r}, expected outcome unknown"
                 for k, v in sorted(reasons.items()) if not v.startswith("outcome unknown")][:3]
    expected = {k: 1 for k in every - held}
    problems += counts_problems(await applied_counts(conn, schema, topic), expected)
    if held - every:
        problems.append(f"quarantine rows of no record: {sorted(held - every)[:6]}")
    return problems
