"""The alert rules, checked and unit-tested by Prometheus's own promtool.

``promtool check rules`` and ``promtool test rules`` pass; every alert has a test case in
which it fires, and the tests notice when any one alert never fires; every alert has a
summary, a description and a runbook link to a section of docs/monitoring.md.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ops.monitoring import RULE_TESTS, RULES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "monitoring.md"
# the alerts the rules must have (issue: stall, lag growing, quarantine rate and total,
# lifetimes restarting, offset mirror, not ready, no owner, handler retrying)
EXPECTED = {
    "FencePartitionStalled", "FencePartitionLagGrowing", "FenceRecordsQuarantined",
    "FenceQuarantineRateHigh", "FenceLifetimesRestarting", "FenceOffsetMirrorLagging",
    "FenceWorkerNotReady", "FenceWorkerDown", "FencePartitionUnowned", "FenceHandlerRetrying",
}


def _alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def _run(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_promtool_checks_the_rules(promtool: Path) -> None:
    done = _run(promtool, "check", "rules", RULES.name, cwd=RULES.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(yaml.safe_load(RULES.read_text())['groups'][0]['rules'])} rules" \
        in done.stdout


def test_promtool_unit_tests_pass(promtool: Path) -> None:
    done = _run(promtool, "test", "rules", RULE_TESTS.name, cwd=RULES.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_expected_alert_exists_and_fires_in_a_test_case() -> None:
    assert {a["alert"] for a in _alerts()} == EXPECTED
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {case["alertname"] for t in tests for case in t.get("alert_rule_test", [])
              if case.get("exp_alerts")}
    quiet = {case["alertname"] for t in tests for case in t.get("alert_rule_test", [])
             if not case.get("exp_alerts")}
    assert firing == EXPECTED
    assert quiet == EXPECTED  # each also has a time or series at which it must not fire


@pytest.mark.parametrize("alert", sorted(EXPECTED))
def test_the_tests_fail_when_an_alert_never_fires(promtool: Path, tmp_path: Path,
                                                  alert: str) -> None:
    """The rule replaced by one that never fires: ``promtool test rules`` must fail."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = "vector(1) > 2"
    (tmp_path / RULES.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    groups = [t["name"] for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              if any(c["alertname"] == alert for c in t.get("alert_rule_test", []))]
    only = "^(?:" + "|".join(re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", g)
                             for g in groups) + ")$"  # RE2: escape the metacharacters only
    done = _run(promtool, "test", "rules", f"--run={only}", RULE_TESTS.name, cwd=tmp_path)
    report = done.stdout + done.stderr  # promtool prints the failed cases to stderr
    assert done.returncode != 0 and f"alertname: {alert}," in report, report


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in markdown.splitlines():
        heading = re.match(r"#+\s+(.*)", line)
        if heading:
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def test_every_alert_has_a_summary_a_description_and_a_runbook_section() -> None:
    anchors = _anchors(DOCS.read_text())
    for alert in _alerts():
        notes = alert["annotations"]
        assert notes.get("summary") and notes.get("description"), alert["alert"]
        assert alert["labels"]["severity"] in ("page", "ticket"), alert["alert"]
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page == "docs/monitoring.md", alert["alert"]
        assert anchor == alert["alert"].lower() and anchor in anchors, alert["alert"]
