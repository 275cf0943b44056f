"""The docs site builds with ``mkdocs build --strict`` (what ``make docs`` runs): a broken
link, a missing anchor or a page the nav names but the folder lacks fails the build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "docs" / "mkdocs" / "mkdocs.yml"
MKDOCS = Path(sys.executable).parent / "mkdocs"


def build(site: Path, config: Path = CONFIG) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strict(tmp_path: Path) -> None:
    assert MKDOCS.exists(), f"{MKDOCS} missing: `make setup` installs the docs extra"
    done = build(tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    pages = {p.relative_to(tmp_path / "site").as_posix()
             for p in (tmp_path / "site").rglob("index.html")}
    for md in (ROOT / "docs").glob("*.md"):
        name = "index.html" if md.stem == "index" else f"{md.stem}/index.html"
        assert name in pages, f"docs/{md.name} has no page in the site"


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The strict build is not vacuous: the same config over a copy with one bad anchor fails."""
    docs = tmp_path / "docs"
    (docs / "mkdocs").mkdir(parents=True)
    for md in (ROOT / "docs").glob("*.md"):
        (docs / md.name).write_text(md.read_text())
    (docs / "bench").symlink_to(ROOT / "docs" / "bench")
    (docs / "mkdocs" / "mkdocs.yml").write_text(CONFIG.read_text())
    with (docs / "testing.md").open("a") as page:
        page.write("\nSee [the matrix](crash-matrix.md#no-such-heading).\n")
    done = build(tmp_path / "site", docs / "mkdocs" / "mkdocs.yml")
    assert done.returncode == 1
    assert "does not contain an anchor '#no-such-heading'" in done.stderr
