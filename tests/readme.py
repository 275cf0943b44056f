"""The ``fencectl`` command lines the README shows, for tests that check and run them.

``shell_commands()`` takes every line of the README's code blocks (fenced ```` ```bash ````
blocks and indented blocks), drops ``#`` comments, splits ``&&`` chains and unwraps
``eval "$(…)"``; it keeps the pieces that call ``fencectl`` (bare, or as
``.venv/bin/fencectl``), as typed. ``inline_commands()`` adds the ``fencectl …`` code spans
of the prose. ``as_argv`` turns one into the argv ``fencectl`` parses, with the README's
placeholders (``G``, ``T``, ``P``, ``[optional]`` parts) filled in.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

__all__ = ["README", "as_argv", "inline_commands", "shell_commands"]

README = Path(__file__).resolve().parents[1] / "README.md"
_PREFIXES = ("fencectl ", ".venv/bin/fencectl ")
_PLACEHOLDERS = {"G": "g", "T": "t", "P": "0", "N": "10", "E": "1", "ROLE": "worker",
                 "S": "s", "O": "0", "FIRST..LAST": "1..2"}


def _code_lines(text: str) -> list[str]:
    """Lines of fenced blocks and of indented blocks (4+ spaces after a blank line)."""
    lines: list[str] = []
    fenced = indented = False
    prev_blank = True
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        indented = line.startswith("    ") and (indented or prev_blank)
        if fenced or indented:
            lines.append(line.strip())
        prev_blank = not line.strip()
    return lines


def _pieces(line: str) -> list[str]:
    line = re.sub(r"\s+#\s.*$", "", line).strip()
    out = []
    for piece in line.split("&&"):
        piece = piece.strip()
        m = re.fullmatch(r'eval "\$\((.+)\)"', piece)
        if m:
            piece = m.group(1).strip()
        if piece.startswith(_PREFIXES):
            out.append(piece)
    return out


def shell_commands(text: str | None = None) -> list[str]:
    """Every ``fencectl`` command of the README's code blocks, in order, without repeats."""
    text = README.read_text(encoding="utf-8") if text is None else text
    found = [p for line in _code_lines(text) for p in _pieces(line)]
    return list(dict.fromkeys(found))


def inline_commands(text: str | None = None) -> list[str]:
    """Every ``fencectl …`` code span of the README's prose and tables."""
    text = README.read_text(encoding="utf-8") if text is None else text
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
