"""``ops.bench.worker.summarize``: a run's tries as ``make bench`` and ``ops.bench.trees``
report them (the upper median of rates and of CPU per record, every try's figures)."""

from __future__ import annotations

from ops.bench.worker import summarize


def test_summary_takes_the_upper_median_of_rates_and_cpu_and_keeps_every_try() -> None:
    tries = [{"records_per_s": r, "cpu_us_per_record": c, "steal_share": s}
             for r, c, s in [(100, 30.0, 0.01), (300, 20.0, 0.0), (200, None, 0.05),
                             (400, 25.0, None)]]
    got = summarize(tries)
    assert got["records_per_s"] == 300 and got["all_records_per_s"] == [100, 300, 200, 400]
    assert got["cpu_us_per_record"] == 20.0  # the fields of the try at the median rate
    assert got["median_cpu_us_per_record"] == 25.0
    assert got["all_cpu_us_per_record"] == [30.0, 20.0, None, 25.0]
    assert max(s for s in got["all_steal_share"] if s is not None) == 0.05


def test_summary_without_cpu_marks_has_no_cpu_median() -> None:
    assert summarize([{"records_per_s": 5}])["median_cpu_us_per_record"] is None
