"""The site is organised for its readers and every page can be found.

- ``docs/mkdocs/mkdocs.yml``'s nav is Home, then the sections Tutorials, How-to guides,
  Reference, Explanation, Evidence; every ``docs/*.md`` is in it exactly once, and it names
  no page that does not exist;
- every page but the home page is linked from another page (the home page counts);
- the home page's first link is the Quick start;
- the README's "Documentation" list has one item per section, in the nav's order, linking
  exactly that section's pages;
- the strict build (``make docs``) fails when a page is left out of the nav: the nav's
  ``omitted_files`` validation is ``warn``, proven on a copy of the site whose nav lacks a
  page.

The checks are pure functions over page texts, so each is also shown to catch a mutated
copy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG = DOCS / "mkdocs" / "mkdocs.yml"
README = ROOT / "README.md"
MKDOCS = Path(sys.executable).parent / "mkdocs"

SECTIONS = ("Tutorials", "How-to guides", "Reference", "Explanation", "Evidence")
HOME = "index.md"
QUICK_START = "quickstart.md"

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


class _Loader(yaml.SafeLoader):
    """A safe loader that reads any tag (``!!python/name:…`` of a plugin) as None."""


_Loader.add_multi_constructor("", lambda _loader, _suffix, _node: None)


def load_config(text: str) -> dict[str, Any]:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects


def nav_sections(config: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """The nav as (title, pages) in order; a top-level page is a section of its own."""
    out: list[tuple[str, list[str]]] = []
    for entry in config.get("nav") or []:
        if isinstance(entry, str):
            out.append((entry, [entry]))
            continue
        for title, value in entry.items():
            out.append((title, list(_pages(value))))
    return out


def _pages(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        if not re.match(r"[a-z]+://", value):
            yield value
        return
    for item in value:
        if isinstance(item, str):
            yield from _pages(item)
        else:
            for sub in item.values():
                yield from _pages(sub)


def prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return _FENCE.sub("", text)


def page_links(text: str) -> list[str]:
    """The pages a docs page links, in order: relative ``*.md`` targets without anchors."""
    out = []
    for target in _LINK.findall(prose(text)):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if path.endswith(".md"):
            out.append(os.path.normpath(path))
    return out


def nav_problems(config: Mapping[str, Any], pages: set[str]) -> list[str]:
    """What is wrong with the nav against the pages ``docs/*.md`` holds."""
    sections = nav_sections(config)
    problems = []
    titles = [title for title, _ in sections]
    if titles[:1] != ["Home"] or sections[0][1] != [HOME]:
        problems.append(f"the nav starts with Home: {HOME}, not {sections[:1]}")
    if titles[1:] != list(SECTIONS):
        problems.append(f"the nav's sections are {list(SECTIONS)}, not {titles[1:]}")
    listed = [page for _, section in sections for page in section]
    for page in sorted(pages - set(listed)):
        problems.append(f"docs/{page} is in no section of the nav")
    for page in sorted({p for p in listed if listed.count(p) > 1}):
        problems.append(f"docs/{page} is in the nav {listed.count(page)} times")
    for page in sorted(set(listed) - pages):
        problems.append(f"the nav names {page}, which docs/ does not hold")
    return problems


def unlinked(texts: Mapping[str, str]) -> list[str]:
    """Pages (other than the home page) that no other page links."""
    linked = {target for name, text in texts.items()
              for target in page_links(text) if target != name}
    return sorted(name for name in texts if name != HOME and name not in linked)


def first_link(text: str) -> str | None:
    links = page_links(text)
    return links[0] if links else None


def readme_sections(readme: str) -> list[tuple[str, list[str]]]:
    """The README's "## Documentation" list as (label, linked docs pages) per item."""
    match = re.search(r"^## Documentation\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    if match is None:
        return []
    items: list[tuple[str, list[str]]] = []
    for item in re.split(r"^- ", match.group(1), flags=re.M)[1:]:
        label = item.split(":", 1)[0].strip()
        links = [m[len("docs/"):].split("#", 1)[0] for m in _LINK.findall(item)
                 if m.startswith("docs/")]
        items.append((label, links))
    return items


def readme_problems(readme: str, config: Mapping[str, Any]) -> list[str]:
    """Where the README's Documentation list and the nav's sections disagree."""
    want = [(title, pages) for title, pages in nav_sections(config) if title in SECTIONS]
    have = readme_sections(readme)
    problems = []
    if [label for label, _ in have] != [title for title, _ in want]:
        problems.append(f"README's Documentation items are {[label for label, _ in have]}, "
                        f"the nav's sections {[title for title, _ in want]}")
    have_by = dict(have)
    for title, pages in want:
        links = have_by.get(title, [])
        missing = [p for p in pages if p not in links]
        extra = [p for p in links if p not in pages]
        if missing:
            problems.append(f"README's {title!r} item lacks {missing}")
        if extra:
            problems.append(f"README's {title!r} item links {extra}, not pages of that section")
    return problems


def _site_texts() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in DOCS.glob("*.md")}


# -- the site as it is ---------------------------------------------------------------------

def test_every_page_is_in_the_nav_once() -> None:
    problems = nav_problems(load_config(CONFIG.read_text()), set(_site_texts()))
    assert not problems, "\n".join(problems)


def test_every_page_is_linked_from_another_page() -> None:
    assert not unlinked(_site_texts()), unlinked(_site_texts())


def test_the_home_page_links_the_quick_start_first() -> None:
    assert first_link((DOCS / HOME).read_text(encoding="utf-8")) == QUICK_START


def test_the_readme_documentation_list_covers_the_sections() -> None:
    problems = readme_problems(README.read_text(encoding="utf-8"), load_config(CONFIG.read_text()))
    assert not problems, "\n".join(problems)


def test_a_page_left_out_of_the_nav_is_a_warning() -> None:
    """``omitted_files: warn``: with ``--strict`` (``make docs``) a warning fails the build."""
    validation = load_config(CONFIG.read_text())["validation"]["nav"]
    assert validation["omitted_files"] == "warn", validation


# -- the checks catch what they are for ----------------------------------------------------

def _without_line(text: str, line: str) -> str:
    assert f"\n{line}\n" in text, line
    return text.replace(f"\n{line}\n", "\n", 1)


def test_the_nav_check_catches_a_missing_page() -> None:
    config = load_config(_without_line(CONFIG.read_text(), "      - concepts.md"))
    assert "docs/concepts.md is in no section of the nav" in nav_problems(
        config, set(_site_texts()))
    renamed = load_config(CONFIG.read_text().replace("- Explanation:", "- How it works:"))
    assert any("sections are" in p for p in nav_problems(renamed, set(_site_texts())))


def test_the_link_check_catches_an_unlinked_page() -> None:
    texts = _site_texts()
    texts["orphan.md"] = "# Orphan\n\nNo page links here.\n"
    texts["other.md"] = "# Other\n\n```text\n[not a link](orphan.md)\n```\n"
    assert unlinked(texts) == ["orphan.md", "other.md"]


def test_the_first_link_check_reads_prose_only() -> None:
    assert first_link("```\n[a](a.md)\n```\nSee [b](b.md#x) and [c](c.md).\n") == "b.md"
    assert first_link("[Services](services.md) first, then [Quick start](quickstart.md).") \
        != QUICK_START


def test_the_readme_check_catches_a_missing_link() -> None:
    config = load_config(CONFIG.read_text())
    readme = README.read_text(encoding="utf-8")
    mutated = readme.replace("(docs/guarantees.md)", "(docs/ARCHITECTURE.md)", 1)
    assert mutated != readme
    assert any("'Explanation' item lacks ['guarantees.md']" in p
               for p in readme_problems(mutated, config))


def _site_copy(tmp_path: Path, config_text: str) -> Path:
    """A copy of docs/ under ``tmp_path`` (pages copied, everything else linked, the
    packages beside it as in the repository) with ``config_text`` as its mkdocs.yml."""
    docs = tmp_path / "docs"
    (docs / "mkdocs").mkdir(parents=True)
    for entry in DOCS.iterdir():
        if entry.name == "mkdocs":
            continue
        if entry.suffix == ".md":
            (docs / entry.name).write_text(entry.read_text(encoding="utf-8"), encoding="utf-8")
        else:
            (docs / entry.name).symlink_to(entry)
    for entry in ROOT.iterdir():
        if entry.name not in {"docs", ".git", "artifacts", ".stack"} and not (
                tmp_path / entry.name).exists():
            (tmp_path / entry.name).symlink_to(entry)
    config = docs / "mkdocs" / "mkdocs.yml"
    config.write_text(config_text, encoding="utf-8")
    return config


def test_the_strict_build_fails_on_a_page_missing_from_the_nav(tmp_path: Path) -> None:
    config = _site_copy(tmp_path, _without_line(CONFIG.read_text(), "      - concepts.md"))
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(tmp_path / "site")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    # at WARNING (at INFO the same line is printed and the build passes): --strict fails
    omitted = re.search(r"^WARNING +- +The following pages exist in the docs directory, but are "
                        r"not included in the \"nav\" configuration:\n((?:  - .*\n?)+)",
                        done.stderr, re.M)
    assert omitted is not None, done.stderr[-4000:]
    assert omitted.group(1).split() == ["-", "concepts.md"], omitted.group(1)
    assert done.returncode == 1, done.stderr[-4000:]
