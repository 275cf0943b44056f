"""``ops.bench.suite``: the slowest tests of a run from its JUnit XML, less the waits that are
not theirs, each with what it proves and why it takes its time."""

from __future__ import annotations

import json
from pathlib import Path

from ops.bench import suite

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.pkg.test_a" name="test_waits_for_kafka[eager]" time="40.0">
  <properties><property name="suite_lock_wait_s" value="30.0"/></properties></testcase>
<testcase classname="tests.pkg.test_a" name="test_session_timeout" time="20.0"/>
<testcase classname="tests.pkg.test_a" name="test_fails" time="1.0"><failure/></testcase>
<testcase classname="tests.pkg.test_a" name="test_skipped" time="0.0"><skipped/></testcase>
</testsuite></testsuites>
"""

MODULE = '''"""Module summary. More."""


def test_waits_for_kafka():
    """Waits for Kafka. Details."""


def test_session_timeout():
    pass
'''


def _run(tmp_path: Path) -> dict:
    (tmp_path / "tests" / "pkg").mkdir(parents=True)
    (tmp_path / "tests" / "pkg" / "test_a.py").write_text(MODULE)
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    return suite.report(junit, wall_s=1234.5, command="make test", root=tmp_path)


def test_the_report_takes_the_waits_out_and_names_what_each_proves(tmp_path: Path) -> None:
    data = _run(tmp_path)
    assert data["tests"] == {"passed": 2, "failed": 1, "skipped": 1}
    assert data["wall_s"] == 1234.5
    assert [(r["test"], r["seconds"], r["proves"]) for r in data["slowest"][:2]] == [
        ("tests/pkg/test_a.py::test_session_timeout", 20.0, "Module summary."),
        ("tests/pkg/test_a.py::test_waits_for_kafka[eager]", 10.0, "Waits for Kafka.")]
    assert json.loads(json.dumps(data)) == data


def test_a_slowest_test_without_a_reason_is_named(tmp_path: Path, monkeypatch) -> None:
    data = _run(tmp_path)
    monkeypatch.setattr(suite, "WHY", {"test_session_timeout": "a 6 s session timeout",
                                       "test_fails": "x", "test_skipped": "x"})
    assert suite.why_missing(data) == ["test_waits_for_kafka"]
    table = suite.render(data)
    assert table[2] == ("| 1 | `tests/pkg/test_a.py::test_session_timeout` | 20.0 | "
                        "Module summary. | a 6 s session timeout |")
    assert "**no reason recorded**" in table[3]


def test_the_published_slowest_tests_each_have_a_reason() -> None:
    published = suite.OUT
    assert published.exists(), "docs/bench/suite.json: the cold run's table (docs/testing.md)"
    assert suite.why_missing(json.loads(published.read_text())) == []
