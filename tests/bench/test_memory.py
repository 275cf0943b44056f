"""The memory bound's terms (``ops.bench.memory``): arithmetic of the stated bound, and the
checks ``make bench`` records for each peak it reports."""

from __future__ import annotations

import pytest

from ops.bench.memory import MIB, RECORD_OVERHEAD_BYTES, Settings, bound_mib, checks


def test_small_records_are_bounded_by_the_record_count_of_each_queue() -> None:
    b = bound_mib(base_mib=100, partitions=12, payload_bytes=100, handler_bytes_per_record=0)
    record = 100 + RECORD_OVERHEAD_BYTES
    assert b["queues"] == round(12 * 8000 * record / MIB, 1)  # 500 x 16 records each
    assert b["librdkafka"] == 4 + 12  # prefetch + one fetch response per partition
    assert b["deliveries"] == round(2 * 1000 * record / MIB, 1)
    assert b["handler"] == 0
    assert b["allocator"] == round(0.25 * (b["queues"] + b["deliveries"]), 1)
    assert b["total"] == pytest.approx(sum(v for k, v in b.items() if k != "total"), abs=0.05)


def test_large_records_are_bounded_by_the_bytes_of_each_queue_and_what_librdkafka_held() -> None:
    b = bound_mib(base_mib=100, partitions=6, payload_bytes=MIB)
    assert 96 <= b["queues"] < 96.1  # 16 MiB per partition: 16 records
    # a consume() result never holds more than librdkafka had queued (not 1,000 MiB)
    assert 2 * (4 + 6) <= b["deliveries"] < 2 * (4 + 6) + 1


def test_the_handler_term_counts_the_batches_in_flight() -> None:
    b = bound_mib(base_mib=0, partitions=1, payload_bytes=100, handler_bytes_per_record=1000,
                  settings=Settings(db_concurrency=3, batch_max_records=200))
    assert b["handler"] == round(3 * 200 * 1000 / MIB, 1)


def _result(peak: float) -> dict:
    run = {"peak_rss_mib": peak}
    return {"partitions": 6, "interpreter_mib": 30.0,
            "runs": {"a_raw": {"peak_rss_mib": 110.0},
                     "d_fenceworker_batch1": {"peak_rss_mib": 112.0}, "c_fenceworker": run},
            "scale": {"members_12_partitions": [{"members": 1, **run}, {"members": 2, **run}],
                      "backlog": run, "large_records": {"record_bytes": MIB, **run}}}


def test_checks_cover_every_reported_peak_with_the_worker_s_base() -> None:
    got = checks(_result(150.0))
    assert [c["partitions"] for c in got] == [6, 12, 12, 6]
    # (d) 112 + ((a) 110 - the idle interpreter 30): the worker plus librdkafka at speed
    assert all(c["bound_terms"]["base"] == 192.0 for c in got)
    assert all(c["within_bound"] for c in got)
    over = checks(_result(1000.0))
    assert not any(c["within_bound"] for c in over)


def test_no_base_no_check() -> None:
    result = _result(150.0)
    del result["runs"]["d_fenceworker_batch1"]
    assert checks(result) == []


def test_the_bound_uses_the_worker_s_own_defaults() -> None:
    import inspect

    from consumer.config import PREFETCH, WorkerConfig
    from consumer.kafka.adapter import KafkaThread

    cfg = WorkerConfig(topics=("t",), group_id="g", bootstrap_servers="b", dsn="", handler="m:h")
    s = Settings()
    assert (s.batch_max_records, s.batch_max_bytes, s.queue_max_batches, s.db_concurrency) == (
        cfg.batch_max_records, cfg.batch_max_bytes, cfg.queue_max_batches, cfg.db_concurrency)
    params = inspect.signature(KafkaThread).parameters
    assert s.consume_max_records == params["consume_max_records"].default
    assert s.max_outstanding == params["max_outstanding"].default
    assert s.prefetch_bytes == int(PREFETCH["queued.max.messages.kbytes"]) * 1024
