"""``python -m ops.docgen [--write | --check] [--page PATH ...]``: render or check the
generated regions of the reference pages from the code.

Exit codes: 0 written, or every region fresh; 1 (``--check``) a region differs from the
code, or the code reads an environment variable ``ops.docgen.environment`` does not list;
2 bad usage, or a page with an unknown or unclosed region.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ops.docgen import environment, regions
from ops.docgen.pages import PAGES, REGIONS, ROOT

__all__ = ["main"]


def _shown(page: Path) -> str:
    return str(page.relative_to(ROOT) if page.is_relative_to(ROOT) else page)


def _problems(pages: Sequence[Path]) -> list[str]:
    out = []
    for page in pages:
        stale = regions.stale(page.read_text(encoding="utf-8"), REGIONS)
        if stale:
            out.append(f"{_shown(page)}: stale regions {', '.join(stale)}")
    out += [f"undocumented environment variable {v}" for v in environment.undeclared()]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.docgen",
                                description="render the reference pages' generated regions")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite every generated region")
    mode.add_argument("--check", action="store_true",
                      help="compare only; exit 1 naming the stale regions")
    p.add_argument("--page", type=Path, action="append", default=None,
                   help="only this page (repeatable; default every page with regions)")
    args = p.parse_args(argv)
    pages = [page.resolve() for page in args.page] if args.page else list(PAGES)
    try:
        if args.check:
            problems = _problems(pages)
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                print("run `python -m ops.docgen --write`", file=sys.stderr)
            return 1 if problems else 0
        for page in pages:
            text = page.read_text(encoding="utf-8")
            new = regions.render_text(text, REGIONS)
            if new != text:
                page.write_text(new, encoding="utf-8")
                print(f"wrote {_shown(page)}")
    except ValueError as exc:
        print(f"python -m ops.docgen: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
