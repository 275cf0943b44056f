"""The crash-point conformance matrix by family (issues 11 and 29; ``tests/crash``).

``make test`` runs the reference family's every point under one protocol, rotating by point
so all three protocols appear, and one cell of each other family (sink, failures, replay,
reset), its protocol rotating by family; ``make crash-matrix`` (``FENCE_CRASH_MATRIX=full``)
runs every family's every point under every protocol. Each cell asserts PASS; the module
prints the matrix and writes it as JSON under ``artifacts/crash-matrix/``.
``test_broken_successor_fails_the_cells_it_must`` shows the matrix can fail: a successor
that takes its progress from Kafka's committed offsets turns the cells where Kafka lags
PostgreSQL to FAIL, and leaves a cell with nothing to lose PASS.

The three-node column (``test_crash_point_cell_on_three_nodes``, the ``cluster`` fixture)
kills the group's coordinator at the crash point: ``make crash-matrix`` and ``make
test-kafka-faults`` run its cells (``make test`` none: it runs the Kafka fault subset of
``test_kafka_faults.py`` on the cluster instead).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import pytest

from tests.crash.cell import BROKEN, CellResult, run_cell
from tests.crash.families import all_cells, ci_cells, family_of
from tests.crash.plans import three_node_cells
from tests.crash.report import render, write_json
from tests.crash.tool_cell import run_tool_cell

pytestmark = pytest.mark.integration

FULL = os.environ.get("FENCE_CRASH_MATRIX") == "full"
CELLS = all_cells() if FULL else ci_cells()
THREE_NODE_CELLS = three_node_cells()
# make crash-matrix runs the column; otherwise only make test-kafka-faults does (conftest.py)
_THREE_NODE_SELECTION = (lambda f: f) if FULL else pytest.mark.kafka_faults
_RESULTS: list[CellResult] = []


@pytest.fixture(scope="module", autouse=True)
def _matrix_report(request: pytest.FixtureRequest) -> Iterator[None]:
    start = time.monotonic()
    yield
    if not _RESULTS:
        return
    name = "full" if FULL else "ci"
    args = os.environ.get("FENCE_CRASH_MATRIX_ARGS", "")  # make crash-matrix PYTEST_ARGS=
    command = "make test" if not FULL else "make crash-matrix" + (
        f" PYTEST_ARGS='{args}'" if args else "")
    path = write_json(_RESULTS, name=name, wall_s=time.monotonic() - start, command=command)
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else nullcontext():
        print("\n" + render(_RESULTS) + f"\n(JSON: {path})", flush=True)


@pytest.mark.parametrize(("family", "point", "protocol"), CELLS,
                         ids=[f"{f}-{p}-{g}" for f, p, g in CELLS])
def test_crash_point_cell(services: Any, family: str, point: str, protocol: str) -> None:
    fam = family_of(family)
    result = run_tool_cell(services, fam, protocol) if fam.tool else \
        run_cell(services, point, protocol, family=fam)
    _RESULTS.append(result)
    assert result.passed, (f"{family} {point} x {protocol} FAILED (kept {result.kept}):\n  "
                           + "\n  ".join(result.problems))


@_THREE_NODE_SELECTION
@pytest.mark.parametrize(("point", "protocol"), THREE_NODE_CELLS,
                         ids=[f"{p}-{g}-3nodes" for p, g in THREE_NODE_CELLS])
def test_crash_point_cell_on_three_nodes(services: Any, cluster: Any, point: str,
                                         protocol: str) -> None:
    result = run_cell(services, point, protocol, cluster=cluster)
    _RESULTS.append(result)
    assert result.passed, (f"{point} x {protocol} on three nodes FAILED (kept {result.kept}):"
                           "\n  " + "\n  ".join(result.problems))


def test_broken_successor_fails_the_cells_it_must(services: Any) -> None:
    protocol = "cooperative-sticky"
    must_fail = (("reference", "after-commit"), ("reference", "commit-in-flight"),
                 ("failures", "after-commit"))
    results = {(f, p): run_cell(services, p, protocol, family=family_of(f), successor=BROKEN)
               for f, p in (*must_fail, ("reference", "after-validate"))}
    for cell in must_fail:
        r = results[cell]
        assert not r.passed, f"{cell}: the broken successor passed"
        # it fails for the right reason: the oracle sees records applied twice
        assert any(p.startswith("oracle: ") for p in r.problems), r.problems
    # the failures family's oracle counts applications: a record applied twice
    assert any("applied a wrong number of times" in p
               for p in results["failures", "after-commit"].problems)
    control = results["reference", "after-validate"]
    assert control.passed, control.problems
