"""The lanes bench's table (``ops.bench.lanes.table``): rates against one lane and the
ideal, per partition count."""

from __future__ import annotations

from ops.bench.lanes import table


def test_table_compares_each_run_with_its_one_lane_and_the_ideal() -> None:
    runs = [{"partitions": 1, "lanes": 1, "rate": 450.0},
            {"partitions": 1, "lanes": 4, "rate": 1500.0},
            {"partitions": 6, "lanes": 1, "rate": 2250.0},
            {"partitions": 6, "lanes": 4, "rate": 4500.0}]
    lines = table(runs).splitlines()
    assert lines[2] == "| 1 | 1 | 450 | 1.0 | 450 | 100% |"
    assert lines[3] == "| 1 | 4 | 1,500 | 3.3 | 1,800 | 83% |"
    assert lines[5] == "| 6 | 4 | 4,500 | 2.0 | 9,000 | 50% |"
