"""The benchmark clock's CPU marks and the three kinds of ratio the bench reports.

- Each process marks its own CPU time at the first handler call and the last return; a
  run's ``cpu_s`` is the sum over its processes (members), so CPU per record compares what
  runs do per record whatever the machine's speed.
- ``ratios(runs, "paired")`` is the median of try i over try i; ``ratios(runs, "cpu")`` is
  records per CPU-second (the denominator's CPU per record over the numerator's).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ops.bench.clock import Marks, combined
from ops.bench.worker import ratios


class Ticks:
    """A clock that returns the values it is given, in order, then the last one again."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def __call__(self) -> float:
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


def test_marks_record_the_cpu_time_over_the_span_and_combined_sums_the_members(
        tmp_path: Path) -> None:
    files = [tmp_path / "m0.json", tmp_path / "m1.json"]
    a = Marks(files[0], clock=Ticks(10.0, 11.0, 12.0, 12.5),
              cpu=Ticks(100.0, 100.4, 101.0))
    a.begin()        # wall 10, cpu 100
    a.end(500)       # wall 11, cpu 100.4 (flushed: 11 - 0 >= FLUSH_S; written at 12)
    a.begin()        # not the first: no new first mark
    a.end(500)       # wall 12.5, cpu 101.0 (flushed: 12.5 - 12 >= FLUSH_S)
    b = Marks(files[1], clock=Ticks(10.5, 13.0, 14.0), cpu=Ticks(7.0, 9.5))
    b.begin()
    b.end(1000)
    a.flush()  # the final marks (the timer's flush in a worker)
    marks = [json.loads(f.read_text()) for f in files]
    assert [m["cpu_first"] for m in marks] == [100.0, 7.0]
    assert [m["cpu_last"] for m in marks] == [101.0, 9.5]
    got = combined(files)
    assert got["records"] == 2000
    assert got["cpu_s"] == 1.0 + 2.5
    assert got["elapsed_s"] == 13.0 - 10.0


def test_the_default_cpu_clock_is_this_process_s_cpu_time(tmp_path: Path) -> None:
    m = Marks(tmp_path / "m.json")
    m.begin()
    start = time.process_time()
    time.sleep(0.3)  # wall time passes, CPU time does not
    while time.process_time() - start < 0.2:  # busy until this process used 0.2 s of CPU
        pass
    spent = time.process_time() - start
    m.end(1)
    m.flush()
    got = combined([tmp_path / "m.json"])
    # the process's CPU time whatever the machine's load: not the wall clock (>= 0.5 s here)
    assert 0.2 <= got["cpu_s"] <= spent + 0.05
    assert got["elapsed_s"] >= 0.5


def test_marks_without_cpu_fields_count_no_cpu(tmp_path: Path) -> None:
    """Marks written before the CPU marks existed (or by a run that never marked): 0."""
    (tmp_path / "old.json").write_text(json.dumps({"first": 1.0, "last": 2.0, "records": 10,
                                                    "batches": 1}))
    assert combined([tmp_path / "old.json"])["cpu_s"] == 0.0


def _run(rates: list[int], cpu_us: float | None) -> dict[str, object]:
    ordered = sorted(rates)
    return {"records_per_s": ordered[len(ordered) // 2], "all_records_per_s": rates,
            "median_cpu_us_per_record": cpu_us}


def test_paired_ratios_take_the_median_of_the_per_try_ratios() -> None:
    # try 2 ran in a slow spell for both: the medians' ratio says 0.8, the pairs say 1.0
    runs = {"c_fenceworker": _run([100, 50, 90], 30.0),
            "b_pipelined": _run([100, 50, 110], 27.0)}
    assert ratios(runs)["c_over_b"] == round(90 / 100, 3)
    assert ratios(runs, "paired")["c_over_b"] == 1.0  # median of 1.0, 1.0, 0.818
    assert ratios(runs, "cpu")["c_over_b"] == 0.9  # 27 / 30: c costs 1/0.9 of b per record


def test_paired_and_cpu_ratios_are_none_without_their_data() -> None:
    runs = {"c_fenceworker": _run([100], None), "b_pipelined": _run([100], 27.0)}
    assert ratios(runs, "paired")["c_over_b"] is None  # one try: nothing to pair
    assert ratios(runs, "cpu")["c_over_b"] is None
    assert ratios(runs, "paired")["c_over_e"] is None  # (e) not chosen
    assert "c_sink_over_b_sink" not in ratios(runs, "cpu")  # neither chosen
