"""The ``fencectl`` examples of the README and the docs pages work as typed (no services
needed for these).

Every command of their code blocks parses with the real parser; every flag named in a
``fencectl …`` code span of the prose exists on that command; and the examples that need
neither services nor a running worker are run as typed in a shell whose PATH starts with
``.venv/bin`` (what ``. .venv/bin/activate`` does): ``stack env``, the ``sim-worker --replay``
of a trace made as ``make sim-worker`` makes it, and ``--help`` of every command shown.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.cli import build_parser
from tests.doc_pages import as_argv, inline_commands, page_with, shell_commands

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _subparser(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser of ``words``' command path, e.g. ``reset accept-gap``."""
    for word in words:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    return parser


def shell(script: str, *, cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCE_", "KAFKA_"))}
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(BIN.parent),
                "FENCE_STACK_DIR": str(tmp_path / "stack"),
                "FENCE_CACHE_DIR": str(tmp_path / "cache")})
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_pages_show_commands() -> None:
    commands = shell_commands()
    assert {"fencectl migrate", "fencectl stack env"} <= set(commands), commands
    assert len(inline_commands()) >= 10


@pytest.mark.parametrize("command", shell_commands())
def test_code_block_commands_parse(command: str) -> None:
    try:
        args = build_parser().parse_args(as_argv(command))
    except SystemExit as exc:
        pytest.fail(f"documented command does not parse (exit {exc.code}): {command}")
    assert callable(args.func)


@pytest.mark.parametrize("command", inline_commands())
def test_inline_commands_name_existing_flags(command: str) -> None:
    argv = as_argv(command)
    parser = _subparser(build_parser(), argv)
    known = {opt for action in parser._actions for opt in action.option_strings}
    unknown = [a for a in argv if a.startswith("-") and a not in known]
    assert not unknown, f"{command}: {unknown} not flags of `{parser.prog}`"


def test_stack_env_runs_as_typed(tmp_path: Path) -> None:
    for command in [c for c in shell_commands() if c.endswith("fencectl stack env")]:
        done = shell(f'eval "$({command})" && echo "$KAFKA_BOOTSTRAP_SERVERS"', cwd=ROOT,
                     tmp_path=tmp_path)
        assert done.returncode == 0, (command, done.stderr)
        assert done.stdout.strip().startswith("127.0.0.1:"), (command, done.stdout)


def test_sim_worker_replay_runs_as_typed(tmp_path: Path) -> None:
    (replay,) = [c for c in shell_commands() if c.startswith("fencectl sim-worker --replay")]
    trace = as_argv(replay)[-1]
    # what `make sim-worker SEED=18` does (Makefile), then the documented line as typed
    made = shell(f"fencectl sim-worker --seed 18 --out {trace} --report {trace}.report",
                 cwd=tmp_path, tmp_path=tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    done = shell(replay, cwd=tmp_path, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == (tmp_path / f"{trace}.report").read_text()


def test_help_of_every_command_shown_runs_as_typed(tmp_path: Path) -> None:
    paths = set()
    for command in shell_commands() + inline_commands():
        argv = as_argv(command)
        depth = 2 if argv[0] in ("stack", "reset") and len(argv) > 1 \
            and not argv[1].startswith("-") else 1
        paths.add(" ".join(argv[:depth]))
    assert {"run", "migrate", "status", "produce", "sim-worker", "trace"} <= paths, paths
    for path in sorted(paths):
        done = shell(f"fencectl {path} --help", cwd=ROOT, tmp_path=tmp_path)
        assert done.returncode == 0 and "usage: fencectl" in done.stdout, (path, done.stderr)
        assert "Traceback" not in done.stderr


def test_the_handler_page_documents_every_source_record_field() -> None:
    import dataclasses
    import re

    from fencing.types import SourceRecord

    text = page_with("## The handler\n").read_text(encoding="utf-8")
    section = text[text.index("`fencing.types.SourceRecord`"):]
    section = section[:section.index("\n\n", section.index("| field |"))]
    documented = set(re.findall(r"^\| ((?:`\w+`(?:, )?)+) \|", section, re.MULTILINE))
    names = {n.strip("`") for cell in documented for n in cell.split(", ")}
    assert names == {f.name for f in dataclasses.fields(SourceRecord)}
