"""The README is a front door and the docs state current facts.

- ``README.md`` stays within 350 lines and links every page under ``docs/`` it lists;
- no line of the README or of a docs page narrates rounds of work (a lab notebook: what was
  tried in which session, how a figure moved) — that history is git's.
"""

from __future__ import annotations

import re

import pytest

from tests.doc_pages import DOCS, PAGES, README

#: phrases of a lab notebook, not of documentation (case-insensitive, whole words)
DIARY = (
    "this session", "previous session", "session before", "earlier session", "last session",
    "earlier run", "previous run", "earlier round", "round of work", "rounds of work",
    "tried and dropped", "we found", "we learned", "we tried", "it used to", "was before",
    "went from", "before this change", "after this change", "as of now",
)


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 350, f"README.md has {len(lines)} lines; move detail to docs/"


def test_the_readme_links_pages_that_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README.read_text(encoding="utf-8"))
    assert links, "the README links its docs"
    missing = sorted({link for link in links if not (README.parent / link).exists()})
    assert not missing, missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_line_narrates_work(page) -> None:
    pattern = re.compile(r"\b(" + "|".join(re.escape(p) for p in DIARY) + r")\b", re.I)
    found = [f"{page.name}:{n}: {line.strip()}"
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             if pattern.search(line)]
    assert not found, "\n".join(found)


def test_the_diary_check_catches_a_diary_line() -> None:
    pattern = re.compile(r"\b(" + "|".join(re.escape(p) for p in DIARY) + r")\b", re.I)
    assert pattern.search("This session's first bench measured 67,482.")
    assert pattern.search("Tried and dropped: a larger prefetch.")
    assert not pattern.search("The claim is one statement for the whole assignment.")
    assert DOCS.is_dir()
