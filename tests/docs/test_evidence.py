"""Guides hold current facts; measured figures live on the evidence pages, with provenance.

- no guide (``README.md`` and every ``docs/*.md`` but the evidence pages) names a commit, a
  date or a load average in its prose (code blocks and inline code are a command's own
  text: a sample output's timestamp, a lifetime id);
- every generated table sits on an evidence page, is what ``ops.bench.tables`` renders from
  ``docs/bench/*.json`` today, and opens with one provenance line: the command, the commit
  and the date its JSON records, and the file (no load average: the date and the commit
  say when, the command how);
- every JSON in ``docs/bench/`` records that provenance;
- ``docs/benchmarks.md`` opens with its headline table, each row linking to its section.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ops.bench import tables
from tests.doc_pages import DOCS, PAGES

#: the pages whose subject is measured evidence; every other page is a guide
EVIDENCE = frozenset({"benchmarks.md", "crash-matrix.md", "kafka-failures.md",
                      "simulation.md", "testing.md"})
GUIDES = [p for p in PAGES if p.name not in EVIDENCE]

_FENCED = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?^[ \t]*\1[ \t]*$", re.M | re.S)
_INLINE = re.compile(r"`[^`\n]*`")
#: a short or full commit hash: 7-40 hex digits with a digit and a letter, not an id's suffix
HASH = re.compile(r"(?<![-\w])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![-\w])")
DATE = re.compile(r"\b20\d\d-(\d\d|…)")
LOAD = re.compile(r"load average", re.I)
#: the first line of a generated region: "Measured by `COMMAND` at commit C on YYYY-MM-DD"
PROVENANCE = re.compile(r"^(Measured by|From the one-process runs of) `[^`]+` at commit "
                        r"[0-9a-f]{7,40}(\+dirty)? on \d{4}-\d\d-\d\d "
                        r"\(`docs/bench/[\w.-]+\.json`\)")
_REGION = re.compile(r"<!-- generated: ([\w-]+) -->\n(.*?)<!-- end generated -->", re.S)


def prose(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of ``text`` outside code: fenced and indented blocks dropped,
    inline code spans blanked."""
    text = _FENCED.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    out: list[tuple[int, str]] = []
    in_code, blank_before = False, True
    for n, line in enumerate(text.splitlines(), 1):
        indented = line.startswith(("    ", "\t")) and line.strip() != ""
        in_code = indented and (in_code or blank_before)
        blank_before = line.strip() == ""
        if not in_code:
            out.append((n, _INLINE.sub("``", line)))
    return out


def diary(text: str) -> list[str]:
    """The lines of ``text``'s prose that name a commit, a date or a load average."""
    return [f"{n}: {line.strip()}" for n, line in prose(text)
            if HASH.search(line) or DATE.search(line) or LOAD.search(line)]


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_a_guide_names_no_commit_date_or_load_average(page: Path) -> None:
    found = diary(page.read_text(encoding="utf-8"))
    assert not found, (f"{page.name} narrates measurements; move each figure with its command "
                       "and commit to an evidence page (docs/benchmarks.md):\n" + "\n".join(found))


def test_the_guide_check_catches_a_diary_and_spares_code() -> None:
    assert diary("Measured 2026-12-01 at commit c4e35a9 on a 2-core machine.\n")
    assert diary("cold: 12 min (commit 4649c04).\n")
    assert diary("at a load average of 5 to 9 from other work\n")
    assert diary("(the tree without it, before a0668d5)\n")
    assert not diary("```text\nfence status at 2026-11-29T07:09:26\n```\n")
    assert not diary("Output:\n\n    owner lt-97421b5ac9f6 since 2026-11-29\n")
    assert not diary("owner `lt-97421b5ac9f6`, 12345678 records, the decade 2000s\n")
    assert diary("- a list item\n    continued 2026-12-01\n")  # a list's line, not code


def test_generated_tables_sit_on_evidence_pages_only() -> None:
    assert {p.name for p in tables.PAGES} <= EVIDENCE
    holders = sorted(p.name for p in GUIDES if "<!-- generated:" in p.read_text(encoding="utf-8"))
    assert not holders, f"generated tables on guides: {holders}"


@pytest.mark.parametrize("name", sorted(EVIDENCE))
def test_an_evidence_page_s_generated_regions_are_fresh(name: str) -> None:
    text = (DOCS / name).read_text(encoding="utf-8")
    assert tables.stale_regions(text) == [], (f"docs/{name}: run `python -m ops.bench.tables "
                                              f"--page docs/{name}`")


@pytest.mark.parametrize("name", sorted(EVIDENCE))
def test_each_generated_table_has_one_provenance_line(name: str) -> None:
    text = (DOCS / name).read_text(encoding="utf-8")
    for region, body in _REGION.findall(text):
        lines = body.splitlines()
        if not any(line.startswith("|") for line in lines):
            continue
        assert lines and PROVENANCE.match(lines[0]), (
            f"docs/{name}, region {region}: the first line names the command, commit and "
            f"date: {lines[:1]}")
        assert sum(bool(PROVENANCE.match(line)) for line in lines) == 1, region
        assert not LOAD.search(body), f"docs/{name}, region {region}: a load average"


@pytest.mark.parametrize("source", sorted(tables.BENCH.glob("*.json")), ids=lambda p: p.name)
def test_every_published_json_records_its_provenance(source: Path) -> None:
    p = json.loads(source.read_text(encoding="utf-8")).get("provenance") or {}
    assert p.get("command") and re.fullmatch(r"[0-9a-f]{7,40}", p.get("commit") or ""), p
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", p.get("date") or ""), p


def test_the_benchmarks_page_opens_with_its_headline() -> None:
    text = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    regions = _REGION.findall(text)
    assert regions and regions[0][0] == "headline", "the headline table comes first"
    assert text.index("<!-- generated: headline -->") < text.index("\n## ", text.index("\n## ") + 1)
    rows = [line for line in regions[0][1].splitlines() if line.startswith("| ")][1:]
    assert len(rows) >= 6
    anchors = {_anchor(h) for h in re.findall(r"^#{2,3} (.+)$", text, re.M)}
    for row in rows:
        links = re.findall(r"\]\(#([\w-]+)\)", row)
        assert links and set(links) <= anchors, row


def _anchor(heading: str) -> str:
    """The id MkDocs' toc gives a heading (lower case, punctuation dropped, spaces as -)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "").lower())
    return re.sub(r"[\s]+", "-", text.strip())
