"""The benchmark tables of docs/benchmarks.md (and the crash matrix's of
docs/crash-matrix.md) are what
``ops.bench.tables`` renders from docs/bench/*.json: a page cannot drift from the JSON the
benchmark wrote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ops.bench.tables import BENCH, PAGE, PAGES, REGIONS, main, render_page, stale_regions


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_pages_match_their_json(page: Path) -> None:
    assert stale_regions(page.read_text(encoding="utf-8")) == [], "run `python -m ops.bench.tables`"


def test_check_covers_every_page() -> None:
    assert {p.name for p in PAGES} == {"benchmarks.md", "crash-matrix.md", "testing.md"}
    assert main(["--check"]) == 0


def test_every_region_is_on_the_page_and_every_json_is_used() -> None:
    for name, region in REGIONS.items():
        text = (PAGE.parent / region.page).read_text(encoding="utf-8")
        assert f"<!-- generated: {name} -->" in text
    used = {r.source for r in REGIONS.values()}
    assert {p.name for p in BENCH.glob("*.json")} <= used


def test_a_changed_figure_makes_its_region_stale(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    shutil.copytree(BENCH, bench)
    worker = json.loads((bench / "worker-quiet.json").read_text())
    worker["runs"]["c_fenceworker"]["records_per_s"] += 1
    (bench / "worker-quiet.json").write_text(json.dumps(worker))
    # the headline quotes (c) too: both regions go stale, nothing else
    assert stale_regions(PAGE.read_text(encoding="utf-8"), bench) == ["headline", "worker-runs"]


def test_a_typed_edit_inside_a_region_is_caught() -> None:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("<!-- generated: store -->")
    edited = text[:start] + text[start:].replace(" | ", " |  ", 1)
    assert stale_regions(edited) == ["store"]
    assert render_page(edited) == text


def test_text_outside_the_regions_is_kept_and_bad_regions_are_refused() -> None:
    page = "intro\n<!-- generated: assignment -->\nold\n<!-- end generated -->\noutro\n"
    out = render_page(page)
    assert out.startswith("intro\n<!-- generated: assignment -->\nMeasured by `make bench`")
    assert out.endswith("<!-- end generated -->\noutro\n") and "old" not in out
    with pytest.raises(ValueError, match="unknown generated region 'nope'"):
        render_page("<!-- generated: nope -->\n<!-- end generated -->\n")
    with pytest.raises(ValueError, match="not closed"):
        render_page("<!-- generated: store -->\nx\n")


def test_the_crash_matrix_table_rows_are_family_and_point() -> None:
    from ops.bench.crash_tables import crash_matrix
    cells = [{"family": "reference", "point": "after-claim", "protocol": "eager-range",
              "passed": True, "recovery_s": 2.04},
             {"family": "reset", "point": "in-reset", "protocol": "kip848-consumer",
              "passed": False, "recovery_s": None},
             {"family": "reference", "point": "after-claim", "protocol": "eager-range",
              "passed": True, "recovery_s": 9.0, "three_nodes": True}]
    lines = crash_matrix({"provenance": {"command": "make crash-matrix", "date": "d",
                                         "commit": "c"}, "cells": cells, "passed": 2,
                          "total": 3, "wall_s": 120, "recovery_s": {"count": 0}})
    assert lines[0].startswith("Measured by `make crash-matrix` at commit c on d")
    assert "2/3" in lines[0]
    assert "| reference | after-claim | PASS 2.0s | - | - |" in lines
    assert "| reset | in-reset | - | - | FAIL |" in lines


def test_the_headline_quotes_its_sections_and_leaves_out_what_the_run_lacks() -> None:
    from ops.bench.tables import headline
    full = json.loads((BENCH / "worker-quiet.json").read_text())
    text = "\n".join(headline(full))
    c = full["runs"]["c_fenceworker"]["records_per_s"]
    assert f"{c:,} records/s" in text
    assert "[A peer side by side](#a-peer-side-by-side)" in text
    assert f"Quix Streams {full['peer']['kill'][1]['duplicates']:,}" in text
    quick = {**full, "latency": None, "peer": None, "memory": []}
    rows = [line for line in headline(quick) if line.startswith("| ")][1:]
    assert rows and not any("Latency" in r or "peer" in r or "Memory" in r for r in rows)


def test_crash_recovery_is_summarised_from_the_matrix() -> None:
    from ops.bench.crash_tables import recovery
    report = {"passed": 3, "total": 3,
              "recovery_s": {"count": 2, "min": 1.5, "median": 2.0, "p90": 3.25, "max": 4.0}}
    assert recovery(report)[-1] == "| 3/3 | 2 | 1.50 s | 2.00 s | 3.25 s | 4.00 s |"
    assert recovery({"passed": 1, "total": 2, "recovery_s": {}})[-1].startswith("| 1/2 | 0 |")
