"""The bench's measure of a quiet machine: the share of CPU time the hypervisor stole over
each run (``ops.bench.runs.steal_share``) and its median and largest over all tries."""

from __future__ import annotations

from ops.bench.runs import cpu_ticks, steal_share
from ops.bench.worker import steal_summary


def test_steal_share_is_the_stolen_part_of_the_machine_s_ticks_between_two_readings() -> None:
    steal, total = cpu_ticks()
    assert 0 <= steal <= total and total > 0
    assert steal_share((100, 1_000), (130, 1_300)) == 0.1
    assert steal_share((5, 50), (5, 50)) == 0.0  # no tick between: no division by zero
    runs = {"b": {"all_steal_share": [0.01, 0.2, 0.03]}, "c": {"all_steal_share": [0.02]},
            "a": {"steal_share": 0.5}}  # a one-try run without the list counts nothing
    assert steal_summary({"runs": runs}) == {"median": 0.025, "max": 0.2}
