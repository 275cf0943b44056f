"""The ``fencectl`` command lines the README and the docs pages show, for tests that check
and run them.

``PAGES`` are ``README.md`` and every ``docs/*.md``; ``page_with(text)`` is the one page
that holds a passage (a test follows its example to whichever page it moved to).
``shell_commands()`` takes every line of the pages' code blocks (fenced ```` ```bash ````
blocks and indented blocks), drops ``#`` comments, splits ``&&`` chains and unwraps
``eval "$(…)"``; it keeps the pieces that call ``fencectl`` (bare, or as
``.venv/bin/fencectl``), as typed. ``inline_commands()`` adds the ``fencectl …`` code spans
of the prose. ``as_argv`` turns one into the argv ``fencectl`` parses, with the pages'
placeholders (``G``, ``T``, ``P``, ``[optional]`` parts) filled in.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

__all__ = ["DOCS", "PAGES", "README", "as_argv", "inline_commands", "page_with",
           "shell_commands"]

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = (README, *sorted(DOCS.glob("*.md")))
_PREFIXES = ("fencectl ", ".venv/bin/fencectl ")
_PLACEHOLDERS = {"G": "g", "T": "t", "P": "0", "N": "10", "E": "1", "ROLE": "worker",
                 "S": "s", "O": "0", "FIRST..LAST": "1..2"}


def _code_lines(text: str) -> list[str]:
    """Lines of fenced blocks and of indented blocks (4+ spaces after a blank line); a line
    ending in a backslash is continued by the next one (a shell continuation), so a command
    shown over several lines is one line here."""
    lines: list[str] = []
    fenced = indented = False
    prev_blank = True
    continued = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        indented = line.startswith("    ") and (indented or prev_blank)
        if fenced or indented:
            code = re.sub(r"\s+#\s.*$", "", line).strip()
            if continued:
                lines[-1] = f"{lines[-1][:-1].rstrip()} {code}"
            else:
                lines.append(code)
            continued = code.endswith("\\")
        prev_blank = not line.strip()
    return lines


def _before_pipe(piece: str) -> str:
    """``piece`` up to its first unquoted, unescaped ``|`` (a pipeline's first command)."""
    quote = ""
    for i, char in enumerate(piece):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "|" and (i == 0 or piece[i - 1] != "\\"):
            return piece[:i].strip()
    return piece


def _pieces(line: str) -> list[str]:
    line = re.sub(r"\s+#\s.*$", "", line).strip()
    out = []
    for piece in line.split("&&"):
        piece = _before_pipe(piece.strip())
        m = re.fullmatch(r'eval "\$\((.+)\)"', piece)
        if m:
            piece = m.group(1).strip()
        if piece.startswith(_PREFIXES):
            out.append(piece)
    return out


def _all_pages() -> str:
    return "\n\n".join(p.read_text(encoding="utf-8") for p in PAGES)


def page_with(passage: str) -> Path:
    """The one page of ``PAGES`` that contains ``passage``."""
    found = [p for p in PAGES if passage in p.read_text(encoding="utf-8")]
    assert len(found) == 1, f"{passage!r} is on {len(found)} pages: {found}"
    return found[0]


def shell_commands(text: str | None = None) -> list[str]:
    """Every ``fencectl`` command of the pages' code blocks, in order, without repeats."""
    text = _all_pages() if text is None else text
    found = [p for line in _code_lines(text) for p in _pieces(line)]
    return list(dict.fromkeys(found))


def inline_commands(text: str | None = None) -> list[str]:
    """Every ``fencectl …`` code span of the pages' prose and tables."""
    text = _all_pages() if text is None else text
    spans = re.findall(r"(?<!`)`((?:\.venv/bin/)?fencectl [^`]+)`(?!`)", text)
    # a span whose second word ends with ":" quotes a message ("fencectl run: ..."), not a command
    return list(dict.fromkeys(s for s in spans if not s.split(" ", 2)[1].endswith(":")
                              and s.split(" ", 2)[1] != "…"))


def as_argv(command: str) -> list[str]:
    """The arguments after ``fencectl``, placeholders filled and ``[optional]`` parts kept."""
    command = command.replace("\\|", "|").replace("…", "x")
    command = re.sub(r"\[([^\]]*)\]", r"\1", command)
    argv = shlex.split(command)[1:]
    out = []
    for arg in argv:
        if "|" in arg and not arg.startswith("-"):
            arg = arg.split("|")[0]
        out.append(_PLACEHOLDERS.get(arg, arg))
    return out
