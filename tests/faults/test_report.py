"""tests.faults.report.render: the tables the docs page shows, from recorded runs (pure)."""

from __future__ import annotations

from tests.faults.report import render


def _run(scenario: str, protocol: str, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {"scenario": scenario, "protocol": protocol, "passed": True,
                               "member_exits": {}, "drain_s": 10.0, "duplicates": 0,
                               "losses": 0, "commit": "abc1234"}
    return {**base, **kw}


def test_fault_and_restart_tables_fold_the_runs() -> None:
    text = render([
        _run("coordinator-kill", "eager-range", drain_s=10.0),
        _run("coordinator-kill", "eager-range", drain_s=30.0, passed=False,
             member_exits={"b": 3}, duplicates=0),
        _run("kill+restart (static)", "kip848-consumer", drain_s=None, pause_s=7.5),
    ])
    rows = text.splitlines()
    coord = next(r for r in rows if r.startswith("| coordinator-kill |"))
    assert "1/2 pass; exits 1; drain 20.0 / 30.0 s; dup 0; lost 0" in coord
    assert coord.endswith("| - | - |")
    restart = next(r for r in rows if r.startswith("| kill+restart (static) |"))
    assert restart.endswith("| 1/1 pass; 7.5 / 7.5 s |")
    assert "Commits: abc1234." in text
