"""The latency, scaling and peer sections of ``make bench``: their pure pieces (percentiles
of a histogram, the produce-time window, the pauses of a move, the prediction) and the
tables ``ops.bench.tables`` renders from them; the commit-time marks of ``ops.bench.clock``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fencing.types import SourceRecord
from ops.bench import tables
from ops.bench.clock import Latency, Marks, add_latencies, bucket_ms
from ops.bench.latency import merged, pauses, percentiles, window
from ops.bench.scaling import predict


def test_percentiles_are_the_least_latency_covering_the_share() -> None:
    hist = {1: 50, 2: 45, 10: 4, 300: 1}  # 100 records
    assert percentiles(hist) == {"records": 100, "p50": 1, "p95": 2, "p99": 10, "max": 300}
    assert percentiles({})["p99"] is None


def test_window_keeps_the_records_produced_in_its_seconds() -> None:
    hist = {"100": {"5": 2}, "101": {"7": 1}, "102": {"9": 3}}
    assert window(hist, 101, 103) == {7: 1, 9: 3}
    both = merged([hist, {"101": {"7": 2, "8": 1}}])
    assert both["101"] == {"7": 3, "8": 1} and both["100"] == {"5": 2}


def test_pauses_of_a_move() -> None:
    # A commits partitions 0-2 every 0.1 s; partition 2 moves to B at t=10 (B's first commit
    # at 10.5, A's last at 10.0) and returns to A 7 s after B is killed at 20
    a = [[p, t / 10, 1, 5] for t in range(90, 250) for p in (0, 1)]
    a += [[2, t / 10, 1, 5] for t in range(90, 101)] + [[2, 27.0, 1, 5]]
    b = [[2, 10.5, 1, 500], [2, 15.0, 1, 5]]
    got = pauses(a, b, joined_s=9.8, killed_s=20.0)
    assert got["join"] == {"partitions": 1, "max_s": 0.5, "median_s": 0.5}
    assert got["kill"] == {"partitions": 1, "max_s": 7.0, "median_s": 7.0}
    assert got["stayed_longest_gap_s"] == pytest.approx(0.1)


def test_prediction_from_the_one_process_run() -> None:
    runs = [{"handler": "sink", "processes": 1, "records": 100_000, "member_cpu_s": [1.0],
             "pg_cpu_us_per_record": 10.0}]
    got = predict(runs, 8, "sink")  # w = 10, p = 10: 8 cores -> 400,000/s, 4 members
    assert got == {"cores": 8, "members": 4, "records_per_s": 400_000,
                   "worker_us_per_record": 10.0, "pg_us_per_record": 10.0}
    assert predict(runs, 8, "reference") is None


class _Conn:
    """The part of an asyncpg connection the commit marks use: its backend pid and one
    query logger, called (as asyncpg does) once a statement returned."""

    def __init__(self) -> None:
        self.loggers: list[Any] = []

    def get_server_pid(self) -> int:
        return 4242

    def add_query_logger(self, cb: Any) -> None:
        self.loggers.append(cb)

    def ran(self, query: str, exception: BaseException | None = None) -> None:
        for cb in self.loggers:
            cb(SimpleNamespace(query=query, exception=exception))


def test_commit_marks_count_a_batch_once_its_commit_returned(tmp_path: Path) -> None:
    now = [1000.250]
    marks = Marks(tmp_path / "m.json")
    marks.latency = Latency(batches=True, wall=lambda: now[0], changed=marks.changed)
    conn = _Conn()
    recs = [SourceRecord("t", 3, o, None, b"v", (), 1000_000 + o * 10) for o in range(3)]
    marks.latency.began(conn, recs)  # at 1000.250: waited 250, 240, 230 ms
    now[0] = 1000.300
    conn.ran("SELECT 1")  # not the end of the batch
    conn.ran("COMMIT")  # committed at 1000.300
    marks.latency.began(conn, recs[:1])
    conn.ran("ROLLBACK")  # rolled back: not counted
    marks.flush()
    got = json.loads((tmp_path / "m.json").read_text())
    assert got["lat"] == {"1000": {"300": 1, "290": 1, "280": 1}}
    assert got["lat_begin"] == {"1000": {"250": 1, "240": 1, "230": 1, "300": 1}}
    assert got["batch_log"] == [[3, 1000.3, 3, 300]]
    assert len(conn.loggers) == 1  # one logger per connection


def _report() -> dict[str, Any]:
    return {
        "provenance": {"command": "make bench", "date": "2027-01-01", "commit": "abc1234"},
        "partitions": 6,
        "latency": {"steady": [
            {"handler": "sink", "share": 0.25, "rate": 17_000, "mean_batch": 12.5,
             "cpu_us_per_record": 20.0, "commit_ms": {"p50": 9, "p95": 20, "p99": 31,
                                                      "max": 80, "records": 1},
             "handler_call_ms": {"p50": 4, "p99": 15, "records": 1, "p95": 9, "max": 40},
             "control_ms": {"p50": 2, "p99": 11, "records": 1, "p95": 5, "max": 12},
             "machine_cores": 1.234, "pg_cpu_us_per_record": 7.5}],
            "linger": [
                {"handler": "sink", "share": 0.25, "linger_ms": 20, "rate": 17_000,
                 "mean_batch": 40.0, "cpu_us_per_record": 12.0, "machine_cores": 1.1,
                 "pg_cpu_us_per_record": 5.0,
                 "commit_ms": {"p50": 21, "p95": 30, "p99": 40, "max": 90, "records": 1},
                 "handler_call_ms": {"p50": 15, "p99": 25, "records": 1, "p95": 20, "max": 50},
                 "control_ms": {"p50": 2, "p99": 12, "records": 1, "p95": 5, "max": 13}}],
            "one_partition": [
                {"handler": "sink", "share": 0.25, "partitions": 1, "rate": 17_000,
                 "mean_batch": 90.0, "cpu_us_per_record": 10.0, "machine_cores": 0.9,
                 "pg_cpu_us_per_record": 4.0,
                 "commit_ms": {"p50": 8, "p95": 12, "p99": 20, "max": 30, "records": 1}},
                {"handler": "sink", "share": None, "partitions": 1, "rate": 1000,
                 "mean_batch": 8.0, "cpu_us_per_record": 200.0,
                 "commit_ms": {"p50": 9, "p95": 12, "p99": 14, "max": 20, "records": 1}}],
            "capacity": {"reference": 40_000, "sink": 68_000},
            "backlog_cpu_us_per_record": {"reference": 18.0, "sink": 8.0},
            "processes": [
                {"handler": "sink", "share": 0.25, "rate": 17_000, "mean_batch": 30.0,
                 "cpu_us_per_record": 16.0, "processes": 2,
                 "commit_ms": {"p50": 7, "p95": 20, "p99": 25, "max": 60, "records": 1},
                 "handler_call_ms": {"p50": 3, "p99": 12, "records": 1, "p95": 9, "max": 40},
                 "control_ms": {"p50": 2, "p99": 10, "records": 1, "p95": 5, "max": 12}}],
            "low": [{"handler": "sink", "rate": 1000, "runs": [
                {"handler": "sink", "mean_batch": 2.0, "cpu_us_per_record": 700.0,
                 "commit_ms": {"p50": p50, "p99": p99, "max": p99 + 5},
                 "control_ms": {"p99": 4}} for p50, p99 in ((10, 30), (12, 80), (11, 40))]}],
            "moves": [{"setup": "cooperative-sticky", "rate": 7000, "session_timeout_s": 6.0,
                       "join": {"partitions": 3, "max_s": 1.2, "median_s": 1.0},
                       "kill": {"partitions": 3, "max_s": 7.5, "median_s": 7.1},
                       "stayed_longest_gap_s": 0.05}]},
        "scaling": {"cores": 2, "runs": [
            {"handler": "sink", "processes": 1, "records": 1000, "records_per_s": 50_000,
             "member_cpu_s": [0.01], "member_records": [1000], "pg_cpu_us_per_record": 10.0},
            {"handler": "sink", "processes": 2, "records": 1000, "records_per_s": 60_000,
             "member_cpu_s": [0.006, 0.005], "member_records": [500, 500],
             "pg_cpu_us_per_record": 11.0}]},
        "peer": {"records": 1000, "requirement": "quixstreams[postgresql]==3.28.1",
                 "runs": {"fenceworker/insert": {
                     "tool": "fenceworker", "mode": "insert", "records_per_s": 70_000,
                     "all_records_per_s": [70_000], "median_cpu_us_per_record": 12.0,
                     "pg_cpu_us_per_record": 9.0}},
                 "latency": [{"tool": "fenceworker", "rate": 10_000,
                              "row_ms": {"p50": 8, "p99": 30, "max": 50}}],
                 "kill": [{"tool": "fenceworker", "rows": 1000, "duplicates": 0,
                           "missing": 0}]},
    }


def test_the_new_tables_render_from_a_report() -> None:
    report = _report()
    latency = "\n".join(tables.latency_runs(report))
    assert "| sink | 17,000/s (25%) | 9 ms | 20 ms | 31 ms | 80 ms | 2 ms / 11 ms " \
           "| 4 ms / 15 ms | 12.5 | 20.0 (2.5x) | 1.23 |" in latency \
        and "bench/latency.png" in latency
    linger = latency.split("longer `--batch-linger-ms`")[1]
    assert "| sink | 17,000/s (25%) | 5 (default) | 9 ms | 31 ms | 11 ms | 12.5 | 20.0 (2.5x) " \
           "| 7.5 | 1.23 |" in linger
    assert "| sink | 17,000/s (25%) | 20 | 21 ms | 40 ms | 12 ms | 40.0 | 12.0 (1.5x) | 5.0 " \
           "| 1.10 |" in linger
    assert linger.index("5 (default)") < linger.index("| 20 |")
    one = latency.split("on a topic of one partition")[1]
    assert "carry what 6 partitions' did" in latency
    assert "| sink | 17,000/s (25%) | 6 | 9 ms | 31 ms | 12.5 | 20.0 (2.5x) | 7.5 | 1.23 |\n" \
           "| sink | 17,000/s (25%) | 1 | 8 ms | 20 ms | 90.0 | 10.0 (1.2x) | 4.0 | 0.90 |" in one
    assert "| sink | 1,000/s | 6 | 10 ms | 30 ms | 2.0 | 700.0 (87.5x) | — | — |\n" \
           "| sink | 1,000/s | 1 | 9 ms | 14 ms | 8.0 | 200.0 (25.0x) | — | — |" in one
    assert "reference 40,000/s, sink 68,000/s; CPU per record with a backlog: reference " \
           "18.0 µs, sink 8.0 µs" in latency
    assert "| sink | 17,000/s (25%) | 7 ms | 20 ms | 25 ms | 60 ms | 2 ms / 10 ms " \
           "| 3 ms / 12 ms | 30.0 | 16.0 (2.0x) | — |" in latency.split("--processes 2")[1]
    assert "| sink | 1,000/s | 3 | 10-12 ms | 30-80 ms | 35-85 ms | 4 ms | 2 | 700 |" in latency
    assert "| cooperative-sticky | 7,000/s | 1.20 s (median 1.00 s, 3 partitions) | 0.05 s " \
           "| 7.50 s (median 7.10 s, 3 partitions) | 6 s |" in "\n".join(tables.moves(report))
    scaling = "\n".join(tables.scaling_runs(report))
    assert "| sink | 2 | 60,000 | 1.20 | 0.01 s (12.0); 0.01 s (10.0) | 11.0 |" in scaling
    assert "| sink | 10.0 | 10.0 | 100,000/s (1 process) | 400,000/s (4 processes) " \
           in "\n".join(tables.prediction(report))
    peer = "\n".join(tables.peer_runs(report))
    assert "| fenceworker | insert | 70,000 (one try) | 12.0 | 9.0 |" in peer
    assert "| fenceworker (10,000/s) | 8 ms | 30 ms | 50 ms | 1,000 | 0 | 0 |" in peer


def test_a_report_without_the_sections_renders_a_placeholder() -> None:
    for render in (tables.latency_runs, tables.moves, tables.scaling_runs, tables.prediction,
                   tables.peer_runs):
        assert render({"provenance": {}}) == [tables._NOT_YET]
    assert "could not be installed" in tables.peer_runs(
        {"peer": {"skipped": "quixstreams could not be installed"}})[0]


def test_marks_flush_commits_that_follow_the_last_handler_return(tmp_path: Path) -> None:
    """A COMMIT is logged after the handler returned: its latencies must still reach the
    file (``Latency`` asks the marks to write again)."""

    async def scenario() -> dict[str, Any]:
        now = [10.0]
        marks = Marks(tmp_path / "m.json", clock=lambda: now[0])
        marks.latency = Latency(wall=lambda: 5.0, changed=marks.changed)
        conn = _Conn()
        rec = SourceRecord("t", 0, 0, None, b"v", (), 4_990)
        marks.begin()
        marks.latency.began(conn, [rec])
        marks.end(1)  # flushed now: the commit is not in it yet
        conn.ran("COMMIT")
        await asyncio.sleep(0.7)  # FLUSH_S later: written again
        return dict(json.loads((tmp_path / "m.json").read_text()))

    assert asyncio.run(scenario())["lat"] == {"4": {"10": 1}}


def test_postgres_cpu_is_scaled_from_the_polled_interval_to_the_span() -> None:
    from ops.bench.runs import _pg_over_span

    # first mark seen at 10.5 (CPU 100.0), span 10.0 .. 14.0 (4 s), CPU 103.5 at the end
    got = {"elapsed_s": 4.0, "last": 14.0}
    assert _pg_over_span((10.5, 100.0), 103.5, got) == pytest.approx(4.0)
    assert _pg_over_span(None, 103.5, got) is None  # no mark seen while polling
    assert _pg_over_span((10.5, None), 103.5, got) is None  # the server is not local
    # every record handled before a poll saw one: the reading before the records holds it
    assert _pg_over_span(None, 103.5, got, start=99.0) == pytest.approx(4.5)
    assert _pg_over_span((14.5, 103.0), 103.5, got, start=99.0) == pytest.approx(4.5)
    assert _pg_over_span((10.5, None), None, got, start=None) is None


def test_latencies_are_whole_ms_below_100_and_two_significant_digits_above() -> None:
    assert [bucket_ms(x) for x in (0, 99, 100, 109, 999, 1_234, 9_999, 10_500, 123_456)] == [
        0, 99, 100, 100, 990, 1_200, 9_900, 10_000, 120_000]
    hist: dict[int, dict[int, int]] = {}
    # a second's buckets stay few however far the latencies spread (a flush writes them all)
    assert add_latencies(hist, list(range(0, 1000)), 60_999.0) == 60_999
    assert len(hist[0]) <= 40 and sum(hist[0].values()) == 1000


def test_a_latency_run_alone_replaces_the_section_and_keeps_its_provenance(
        tmp_path: Path) -> None:
    published = json.loads((tables.BENCH / "worker-quiet.json").read_text())
    published["provenance"]["commit"] = "abc1234"
    (tmp_path / "worker-quiet.json").write_text(json.dumps(published))
    alone = _report()
    alone["latency"]["provenance"] = {"command": "make bench-latency", "commit": "def5678",
                                      "date": "2027-01-02"}
    alone["latency"]["steady"][0]["rate"] = 18_000
    (tmp_path / "alone.json").write_text(json.dumps(alone))
    tables.merge_latency(tmp_path / "alone.json", tmp_path)
    merged_report = json.loads((tmp_path / "worker-quiet.json").read_text())
    assert merged_report["provenance"]["commit"] == "abc1234"  # the rest stays as measured
    text = "\n".join(tables.latency_runs(merged_report))
    assert text.startswith("Measured by `make bench-latency` at commit def5678 on 2027-01-02")
    assert "| sink | 18,000/s (25%) |" in text
    row = next(r for r in tables.headline(merged_report) if "Produce to committed" in r)
    assert "by `make bench-latency` at commit def5678" in row
    del alone["latency"]["provenance"]
    (tmp_path / "alone.json").write_text(json.dumps(alone))
    with pytest.raises(ValueError, match="no provenance"):
        tables.merge_latency(tmp_path / "alone.json", tmp_path)
