"""The reference pages agree with the code.

- every generated region (``python -m ops.docgen``) of README.md and the docs pages is what
  the code renders today: the exit-code tables of every command, the command line, the
  environment variables, the metrics; and the code reads no environment variable the
  environment page lacks;
- every command and subcommand of the parser has its section on docs/cli.md and a row
  (itself or the command above it) in docs/configuration.md's table of every command;
- every ``--flag`` of a settings table (``| setting | flag / env | default |``: README.md and
  docs/configuration.md, the flags of ``fencectl run``) is a flag of ``fencectl run``, every
  flag of ``fencectl run`` is named on docs/configuration.md, and every default the table
  states is the parser's (or, for a default the code resolves later, the one its help
  states);
- docs/api.md renders the handler API: every name ``fencing.testing`` exports, and the
  handler, factory, context, record, verdict and error names;
- each check catches a mutated copy (a stale region via ``python -m ops.docgen --check``, an
  undeclared variable, an unknown flag, a wrong default).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ops.docgen import environment, regions
from ops.docgen.commands import clean_parser, commands
from ops.docgen.pages import PAGES, REGIONS
from tests.doc_pages import DOCS, README

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_HEADER = "| setting | flag / env | default |"
#: rows whose default is prose, not one value per flag
PROSE_ROWS = {"topics, group", "handler", "processes", "telemetry"}
_NONE = {"", "—", "-", "none", "off", "no export"}


# -- generated regions ---------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_generated_regions_are_fresh(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert regions.names(text), f"{page.name} holds no generated region"
    assert regions.stale(text, REGIONS) == [], f"run `python -m ops.docgen --write` ({page.name})"


def test_every_region_is_on_a_page() -> None:
    shown = {name for page in PAGES for name in regions.names(page.read_text(encoding="utf-8"))}
    assert shown == set(REGIONS)


def test_every_variable_the_code_reads_is_on_the_environment_page() -> None:
    assert environment.undeclared() == []
    page = (DOCS / "environment.md").read_text(encoding="utf-8")
    for name in environment.read_in_code():
        assert f"`{name}`" in page, name


def test_the_check_finds_a_stale_region_in_a_mutated_copy(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    row = "| 5 | unavailable:"
    assert row in text
    copy = tmp_path / "README.md"
    start = text.index(row)
    end = text.index("\n", start)
    copy.write_text(text[:start] + text[start:end].replace("| yes |", "| no |") + text[end:],
                    encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "ops.docgen", "--check", "--page", str(copy)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    assert "stale regions exit-codes-run" in done.stderr
    fresh = subprocess.run([sys.executable, "-m", "ops.docgen", "--check", "--page",
                            str(README)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, check=False)
    assert fresh.returncode == 0, fresh.stderr


def test_the_scan_finds_an_undeclared_variable(tmp_path: Path) -> None:
    for package in ("consumer", "fencing", "ops"):
        (tmp_path / package).mkdir()
    (tmp_path / "ops" / "new.py").write_text(
        'import os\n__all__ = ["FENCE_NOT_A_VARIABLE"]\n'
        'port = os.environ.get("FENCE_NEW_PORT")\nhome = env["SOME_HOME"]\n'
        'child = {}\nchild["FENCE_FOR_A_CHILD"] = "1"\n', encoding="utf-8")
    assert environment.undeclared(tmp_path) == ["FENCE_NEW_PORT (ops/new.py)",
                                                "SOME_HOME (ops/new.py)"]


# -- commands on the pages -----------------------------------------------------------------

def test_every_command_has_its_section_on_the_cli_page() -> None:
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^#{2,4} (fencectl [\w -]+)$", page, re.M))
    assert headings == {c.name for c in commands()}


def test_every_command_is_in_the_configuration_page_s_table() -> None:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    section = page[page.index("## Exit codes"):page.index("## Common mistakes")]
    rows = re.findall(r"^\| \[`([\w -]+)`\]\(exit-codes\.md#", section, re.M)
    for command in commands():
        if command.leaf:
            assert any(" ".join(command.path).startswith(row) for row in rows), command.name


# -- settings tables -----------------------------------------------------------------------

def _run_parser() -> argparse.ArgumentParser:
    (run,) = [c for c in commands(clean_parser()) if c.path == ("run",)]
    return run.parser


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def settings_rows(text: str) -> list[list[str]]:
    """The rows of every settings table of ``text``, as cells."""
    out: list[list[str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == SETTINGS_HEADER:
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                out.append(_cells(row))
    return out


def _outside_parentheses(text: str) -> str:
    depth, out = 0, []
    for char in text:
        depth += char == "("
        if depth == 0:
            out.append(char)
        depth -= char == ")" and depth > 0
    return "".join(out)


def _split_values(cell: str) -> list[str]:
    return [v.strip() for v in re.split(r"[,;]", _outside_parentheses(cell)) if v.strip()]


def _subject_flags(cell: str) -> list[str]:
    """The flags a settings row is about: the first word of each code span outside
    parentheses that starts with ``-`` and opens a clause (at the start of the cell or after
    ``,`` ``;`` ``.`` ``/`` ``or``), not one the prose mentions (``without `--sink-key```)."""
    spans = re.findall(r"(?:^|[,;./]|\bor)\s*`(-[^`]+)`", _outside_parentheses(cell))
    return list(dict.fromkeys(span.split()[0] for span in spans))


def _stated_default(action: argparse.Action) -> str:
    """The parser's default as the tables write it; a default the code resolves later is
    the one its help states (``(default $FENCE_SCHEMA or fence)``: fence)."""
    default = action.default
    if action.nargs == 0:  # a switch: off unless it defaults to on
        return "on" if default else ""
    if default is None:
        found = re.search(r"\(default:? ([^;)]+)", action.help or "")
        text = found.group(1).split(": ")[0].strip() if found else ""
        text = re.split(r",? (?:or|else) ", text)[-1] if text.startswith("$") else text
        return "" if text.startswith("$") else text.split("; ")[0].strip().rstrip(",")
    if isinstance(default, bool) or default == []:
        return "on" if default else ""
    return f"{default:g}" if isinstance(default, float) else str(default)


def _normal(value: str, flag: str) -> str:
    value = _outside_parentheses(value.replace("`", "")).strip().lower()
    if value in _NONE:
        return ""
    if value.endswith(" mib"):
        return str(int(float(value[:-4]) * (1 << 20)))
    for unit in (" ms", " s"):
        if value.endswith(unit) and flag.endswith(f"-{unit.strip()}"):
            value = value[:-len(unit)]
    return value.replace(",", "")


def settings_problems(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """Where ``text``'s settings tables name a flag ``parser`` lacks or state another default."""
    actions = {opt: a for a in parser._actions for opt in a.option_strings}
    problems = []
    for cells in settings_rows(text):
        setting, flags_cell, default_cell = cells[0], cells[1], cells[2]
        for flag in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", " ".join(
                re.findall(r"`([^`]+)`", flags_cell))):
            if flag not in actions:
                problems.append(f"{setting}: {flag} is not a flag of fencectl run")
        if setting in PROSE_ROWS:
            continue
        flags = [f for f in _subject_flags(flags_cell) if f in actions]
        values = _split_values(default_cell)
        if values == ["—"]:
            values = values * len(flags)
        if len(values) != len(flags):
            problems.append(f"{setting}: {len(flags)} flags {flags} but defaults {values}")
            continue
        for flag, value in zip(flags, values, strict=True):
            want = _normal(_stated_default(actions[flag]), flag)
            if _normal(value, flag) != want:
                problems.append(f"{setting}: {flag} defaults to {want or 'nothing'}, the "
                                f"table says {value}")
    return problems


@pytest.mark.parametrize("page", [README, DOCS / "configuration.md"], ids=lambda p: p.name)
def test_settings_tables_name_run_s_flags_and_defaults(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert len(settings_rows(text)) >= 10
    assert settings_problems(text, _run_parser()) == []


def test_every_flag_of_run_is_on_the_configuration_page() -> None:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    named = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", " ".join(
        re.findall(r"`([^`]+)`", page))))
    flags = {opt for a in _run_parser()._actions for opt in a.option_strings
             if a.help is not argparse.SUPPRESS and opt not in ("-h", "--help")}
    assert sorted(flags - named) == []


def test_the_settings_check_catches_a_wrong_flag_and_a_wrong_default() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    wrong_flag = text.replace("`--heartbeat-interval-s`", "`--heartbeat-interval`", 1)
    assert any("--heartbeat-interval is not a flag" in p
               for p in settings_problems(wrong_flag, _run_parser()))
    row = next(line for line in text.splitlines() if line.startswith("| shutdown |"))
    wrong_default = text.replace(row, row.replace("| 15 |", "| 20 |"), 1)
    assert wrong_default != text
    assert settings_problems(wrong_default, _run_parser()) == [
        "shutdown: --shutdown-timeout-s defaults to 15, the table says 20"]


# -- the handler API -----------------------------------------------------------------------

def test_the_api_page_renders_the_handler_api() -> None:
    import fencing.testing

    page = (DOCS / "api.md").read_text(encoding="utf-8")
    rendered = set(re.findall(r"^::: ([\w.]+)$", page, re.M))
    want = {f"fencing.testing.{name}" for name in fencing.testing.__all__} - {
        "fencing.testing.ALL_FAULTS"}
    want |= {"fencing.handler.handler", "fencing.handler.handler_factory",
             "fencing.handler.HandlerContext", "fencing.handler.Transient",
             "fencing.handler.Unavailable", "fencing.types.SourceRecord",
             "fencing.types.ACCEPT", "fencing.types.Reject", "fencing.types.Verdict"}
    assert want <= rendered, sorted(want - rendered)
