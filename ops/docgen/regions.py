"""Generated regions of the docs pages: text between

    <!-- ops.docgen: NAME -->
    <!-- end ops.docgen -->

is rendered from the code (``ops.docgen.pages.REGIONS``), the rest of the page is never
touched. (The evidence pages' tables from measured JSON use their own markers,
``ops.bench.tables``.)

Rules
- A region the page names but the registry lacks, or one left unclosed, is a ``ValueError``.
- Rendering is pure given the code: the same code gives the same text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

__all__ = ["BEGIN", "END", "names", "render_text", "stale"]

BEGIN = "<!-- ops.docgen: {name} -->"
END = "<!-- end ops.docgen -->"
_REGION = re.compile(r"(<!-- ops\.docgen: ([\w-]+) -->\n)(.*?)(<!-- end ops\.docgen -->)", re.S)

Renderer = Callable[[], str]


def names(text: str) -> list[str]:
    """The regions ``text`` holds, in order."""
    return [m.group(2) for m in _REGION.finditer(text)]


def render_text(text: str, renderers: Mapping[str, Renderer]) -> str:
    """``text`` with every region filled by its renderer."""
    if text.count("<!-- ops.docgen: ") != len(_REGION.findall(text)):
        raise ValueError(f"a region is not closed by {END!r}")
    cache: dict[str, str] = {}

    def fill(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in renderers:
            raise ValueError(f"unknown region {name!r}; known: {', '.join(renderers)}")
        if name not in cache:
            cache[name] = renderers[name]().rstrip("\n") + "\n"
        return f"{match.group(1)}{cache[name]}{match.group(4)}"

    return _REGION.sub(fill, text)


def stale(text: str, renderers: Mapping[str, Renderer]) -> list[str]:
    """Names of the regions of ``text`` that differ from what the code renders."""
    fresh = [m.group(3) for m in _REGION.finditer(render_text(text, renderers))]
    return [m.group(2) for m, new in zip(_REGION.finditer(text), fresh, strict=True)
            if m.group(3) != new]
