"""The memory bound of one worker process, term by term, and its check against a peak RSS.

``make bench`` computes it for every run whose peak it reports against the documented
bound (docs/benchmarks.md: one member of 6 and of 12 partitions, the largest member
draining the backlog, 1 MiB records), and records ``bound_mib`` with its terms and
``within_bound`` next to the peak.

Per member, with P the partitions it owns *at its peak* (the first member of a starting
group owns every partition for a moment):

- ``base``: the worker with nothing buffered (Python, asyncpg, OpenTelemetry, the pools):
  the peak of (d) (batches of one: its queues hold 16 records), plus librdkafka's own
  footprint at full speed: the peak of (a) (consumes, translates and drops, 300,000-500,000
  records/s here) less an idle interpreter that imported the same modules (counted in both).
  librdkafka's fetch buffers and per-message structures, and the malloc arenas of its
  threads, take far more than the payload bytes its prefetch bound counts (measured: (a)
  ~97 MiB against an idle 27 MiB).
- ``queues``: P x one partition's queue bound as Python objects: ``queue_max_records``
  records or ``queue_max_bytes`` of key + value, whichever is reached first.
- ``deliveries``: the Kafka thread's consume() results waiting for the loop
  (``max_outstanding`` of them, 1,000 records each, but never more than librdkafka held):
  records that may land in a queue already at its bound before its pause takes effect.
- ``handler``: ``db_concurrency`` batches in flight, each with the handler's own working
  set (the reference handler: measured ~0.7 MiB per 500-record batch, tracemalloc).
- ``allocator``: pymalloc and glibc keep freed memory for reuse and return an arena only
  when it is empty; an allowance of ``ALLOCATOR_SLACK`` on the Python-object terms
  (measured: records freshly built take 8% more RSS than tracemalloc counts; the queues
  churn, which fragments).
- ``librdkafka``: its prefetch (``queued.max.messages.kbytes``) plus one fetch response in
  flight (``max.partition.fetch.bytes`` per partition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20
#: one 100-byte record with its trace header as Python objects, as confluent-kafka hands it
#: over and ``to_record`` keeps it (tracemalloc of 8,000 records: 592 bytes each)
RECORD_OVERHEAD_BYTES = 592 - 100
ALLOCATOR_SLACK = 0.25
#: the reference handler's working set per record of a batch in flight (tracemalloc peak
#: of one 500-record batch against PostgreSQL: 581-688 KiB)
REFERENCE_HANDLER_BYTES_PER_RECORD = 1_450


@dataclass(frozen=True)
class Settings:
    """What bounds the buffers (the worker's defaults unless a run sets them)."""

    batch_max_records: int = 500
    batch_max_bytes: int = MIB
    queue_max_batches: int = 16
    db_concurrency: int = 4
    consume_max_records: int = 1000
    max_outstanding: int = 2
    prefetch_bytes: int = 4096 * 1024  # consumer.config.PREFETCH queued.max.messages.kbytes
    fetch_bytes_per_partition: int = MIB  # librdkafka max.partition.fetch.bytes default


def bound_mib(*, base_mib: float, partitions: int, payload_bytes: int,
              handler_bytes_per_record: int = 0, settings: Settings = Settings(),
              ) -> dict[str, float]:
    """Every term of the bound in MiB, and their sum as ``total``."""
    s = settings
    record = payload_bytes + RECORD_OVERHEAD_BYTES
    per_queue = min(s.batch_max_records * s.queue_max_batches,
                    math.ceil(s.batch_max_bytes * s.queue_max_batches / payload_bytes))
    librdkafka = s.prefetch_bytes + partitions * s.fetch_bytes_per_partition
    per_delivery = min(s.consume_max_records * record, librdkafka + s.consume_max_records
                       * RECORD_OVERHEAD_BYTES)
    in_flight = min(s.batch_max_records, max(1, s.batch_max_bytes // payload_bytes))
    terms = {
        "base": base_mib,
        "queues": partitions * per_queue * record / MIB,
        "deliveries": s.max_outstanding * per_delivery / MIB,
        "handler": s.db_concurrency * in_flight * handler_bytes_per_record / MIB,
        "librdkafka": librdkafka / MIB,
    }
    terms["allocator"] = ALLOCATOR_SLACK * (terms["queues"] + terms["deliveries"]
                                            + terms["handler"])
    terms = {k: round(v, 1) for k, v in terms.items()}
    terms["total"] = round(sum(terms.values()), 1)
    return terms


def check(peak_mib: float, bound: dict[str, float]) -> dict[str, object]:
    """The record ``make bench`` keeps: bound terms, and whether the peak stayed within."""
    return {"bound_mib": bound["total"], "bound_terms": bound,
            "within_bound": peak_mib <= bound["total"]}


def checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The bound against every peak ``make bench`` reports it for, from its ``result``.

    ``base`` is the peak of (d) plus the peak of (a) less ``interpreter_mib`` (see the
    module's docstring); without (a) and (d) there is no check. The subjects:
    (c) on 6 partitions, one member on 12, the largest of 3 members draining the backlog on
    12 (the first to join owns all 12 for a moment), one member on 6 partitions of 1 MiB
    records with the accept-all handler."""
    runs, scale = result.get("runs", {}), result.get("scale", {})
    if "a_raw" not in runs or "d_fenceworker_batch1" not in runs:
        return []
    librdkafka_at_speed = max(0.0, runs["a_raw"]["peak_rss_mib"]
                              - result.get("interpreter_mib", 0.0))
    base = round(runs["d_fenceworker_batch1"]["peak_rss_mib"] + librdkafka_at_speed, 1)
    ref = REFERENCE_HANDLER_BYTES_PER_RECORD
    subjects: list[tuple[str, dict[str, Any] | None, int, int, int]] = [
        ("c_fenceworker", runs.get("c_fenceworker"), result.get("partitions", 6), 100, ref)]
    one = [m for m in scale.get("members_12_partitions", []) if m.get("members") == 1]
    subjects.append(("1 member, 12 partitions", one[0] if one else None, 12, 100, ref))
    subjects.append(("3 members drain the backlog (largest)", scale.get("backlog"), 12, 100,
                     ref))
    large = scale.get("large_records")
    subjects.append(("1 MiB records, 6 partitions", large, 6,
                     (large or {}).get("record_bytes", MIB), 0))
    out = []
    for name, run, partitions, payload, handler_bytes in subjects:
        if run is None:
            continue
        bound = bound_mib(base_mib=base, partitions=partitions, payload_bytes=payload,
                          handler_bytes_per_record=handler_bytes)
        out.append({"run": name, "partitions": partitions, "payload_bytes": payload,
                    "peak_rss_mib": run["peak_rss_mib"], **check(run["peak_rss_mib"], bound)})
    return out
