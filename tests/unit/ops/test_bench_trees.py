"""``ops.bench.trees.summary``: the medians ``make bench`` reports, over one tree's tries."""

from __future__ import annotations

from ops.bench.trees import summary


def test_summary_takes_the_upper_median_of_rates_and_cpu_and_the_worst_steal() -> None:
    tries = [{"records_per_s": r, "cpu_us_per_record": c, "steal_share": s}
             for r, c, s in [(100, 30.0, 0.01), (300, 20.0, 0.0), (200, None, 0.05),
                             (400, 25.0, None)]]
    got = summary(tries)
    assert got["records_per_s"] == 300 and got["all_records_per_s"] == [100, 300, 200, 400]
    assert got["cpu_us_per_record"] == 25.0 and got["all_cpu_us_per_record"] == [30.0, 20.0, 25.0]
    assert got["steal_share_max"] == 0.05


def test_summary_without_cpu_marks_has_no_cpu_median() -> None:
    assert summary([{"records_per_s": 5}])["cpu_us_per_record"] is None
