"""Run a documentation page's code blocks exactly as written, in the order a reader meets them.

A page's fenced ```` ```bash ```` and ```` ```python ```` blocks all run, unless marked
otherwise by an HTML comment on the line before the block, ``<!-- run: OPTION ... -->``:

- ``shell=NAME``: the shell the block is typed into (default ``1``; the page's "in a second
  shell" is ``shell=2``). Each shell keeps its working directory and exported variables
  from block to block (``cd``, ``. .venv/bin/activate``, ``eval "$(fencectl stack env)"``),
  as one terminal would. Every shell starts in the page's start directory.
- ``background``: the block keeps running (a worker). The next block typed into the same
  shell, or the end of the page, first stops it as Ctrl-C does (SIGINT to its process
  group); it must then exit 0 without a traceback.
- ``wait``: run the block again (every 2 s, up to ``wait_s``) until the output block that
  follows it matches.
- ``save=FILE``: a ```` ```python ```` block is saved as ``FILE`` in the working directory
  of its shell (what "save this as FILE" tells the reader), not run. A python block without
  it runs with the ``python`` its shell finds on ``PATH``.
- ``stop=NAME``: before the block runs, Ctrl-C the worker running in shell ``NAME`` (what
  the page tells the reader to do in that shell).
- ``skip="REASON"``: not run here; the reason names where it is tested instead.

A ```` ```text ```` block marked ``<!-- run: output -->`` is what the block before it must
print: its lines must appear in the output in order and together; a line ``…`` stands for
any number of lines and ``…`` inside a line for any text; trailing spaces are ignored.

Each block runs under ``bash -e``: a command that fails fails the page. The environment is
the caller's (``PATH`` without the project's virtualenv, no ``PYTHONPATH``), so the page's
own ``. .venv/bin/activate`` is what puts ``fencectl`` on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "PageRun", "blocks", "output_matches"]

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"<!--\s*run:(.*?)-->\s*\Z", re.S)
_RUN_LANGS = ("bash", "python")
_OPTIONS = {"shell", "background", "wait", "save", "skip", "output", "stop"}


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced code block of a page and the options of its ``<!-- run: -->`` mark."""

    lang: str
    text: str
    line: int
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def shell(self) -> str:
        return self.options.get("shell", "1")

    def where(self, page: Path) -> str:
        return f"{page.name}:{self.line}"


def _options(mark: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for word in shlex.split(mark):
        key, _, value = word.partition("=")
        if key not in _OPTIONS:
            raise ValueError(f"unknown run option {key!r} in <!-- run:{mark}-->")
        found[key] = value
    return found


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks in order, each with the options of the mark before it."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n")
        last = before.rsplit("\n", 1)[-1]
        mark = _MARK.search(last)
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(match.group(1), match.group(2), line,
                           _options(mark.group(1)) if mark else {}))
    return found


def _pattern(expected: str) -> re.Pattern[str]:
    parts = []
    for line in expected.rstrip("\n").splitlines():
        line = line.rstrip()
        if line == "…":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*".join(re.escape(p) for p in line.split("…")) + r"\n")
    return re.compile("^" + "".join(parts), re.M)


def output_matches(expected: str, output: str) -> bool:
    """True when ``expected`` (``…`` lines and spans as wildcards) appears in ``output``."""
    clean = "\n".join(ln.rstrip() for ln in output.splitlines()) + "\n"
    return _pattern(expected).search(clean) is not None


def _reader_signals() -> None:
    """A background block starts with Ctrl-C's default action, as in a reader's terminal:
    a process that ignores SIGINT passes the ignoring on to its children (a shell cannot
    even trap it then), and the pytest worker running the page may have been left ignoring
    it (the page's worker got no Ctrl-C in a full ``make test``, and passed alone)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class PageRun:
    """The shells of one reader working through one page; ``run()`` plays every block."""

    def __init__(self, page: Path, *, start: Path, env: Mapping[str, str], work: Path,
                 wait_s: float = 180.0, block_timeout_s: float = 900.0) -> None:
        self.page = page
        self.start = start
        self.env = dict(env)
        self.work = work
        self.wait_s = wait_s
        self.block_timeout_s = block_timeout_s
        self.background: dict[str, tuple[subprocess.Popen[str], Block]] = {}
        self.transcript: list[tuple[Block, str]] = []

    # -- shells -------------------------------------------------------------------------

    def _state(self, shell: str) -> Path:
        state = self.work / f"shell-{shell}.state"
        if not state.exists():
            state.write_text(f"cd {shlex.quote(str(self.start))}\n")
        return state

    def cwd(self, shell: str) -> Path:
        """The shell's working directory after the blocks typed into it so far."""
        last = self._state(shell).read_text().rstrip("\n").rsplit("\n", 1)[-1]
        assert last.startswith("cd "), last
        return Path(shlex.split(last[3:])[0])

    def _script(self, shell: str, code: str, *, keep_state: bool) -> str:
        state = shlex.quote(str(self._state(shell)))
        script = f"source {state}\n{code}\n"
        if keep_state:
            script += f'{{ export -p; printf "cd %q\\n" "$PWD"; }} > {state}\n'
        return script

    def _code(self, block: Block) -> str:
        if block.lang == "python":
            path = self.work / f"block-{block.line}.py"
            path.write_text(block.text)
            return f"python - < {shlex.quote(str(path))}"  # as typed at a prompt: cwd on sys.path
        return block.text

    # -- blocks -------------------------------------------------------------------------

    def stop(self, shell: str) -> None:
        """Ctrl-C in ``shell``'s foreground process, which must exit 0 cleanly."""
        running = self.background.pop(shell, None)
        if running is None:
            return
        proc, block = running
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            out = proc.communicate(timeout=90)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out = proc.communicate()[0]
            raise AssertionError(f"{block.where(self.page)}: no exit within 90 s of Ctrl-C:\n"
                                 f"{out[-4000:]}") from None
        self.transcript.append((block, out))
        assert proc.returncode == 0, (f"{block.where(self.page)} exited {proc.returncode} "
                                      f"after Ctrl-C:\n{out[-4000:]}")
        assert "Traceback" not in out, f"{block.where(self.page)}:\n{out[-4000:]}"

    def stop_all(self) -> None:
        for shell in list(self.background):
            self.stop(shell)

    def assert_alive(self) -> None:
        for proc, block in self.background.values():
            if proc.poll() is not None:
                out = proc.communicate()[0]
                raise AssertionError(f"{block.where(self.page)} (still running on the page) "
                                     f"exited {proc.returncode}:\n{out[-4000:]}")

    def _once(self, block: Block) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-e", "-c",
                               self._script(block.shell, self._code(block), keep_state=True)],
                              env=self.env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=self.block_timeout_s,
                              check=False)

    def run_block(self, block: Block, expected: Block | None) -> str:
        self.stop(block.shell)  # typing into a shell whose worker runs: Ctrl-C it first
        if "stop" in block.options:
            self.stop(block.options["stop"])
        self.assert_alive()
        if "background" in block.options:
            proc = subprocess.Popen(
                ["bash", "-e", "-c", self._script(block.shell, self._code(block),
                                                  keep_state=False)],
                env=self.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_reader_signals)
            self.background[block.shell] = (proc, block)
            return ""
        deadline = time.monotonic() + self.wait_s
        while True:
            done = self._once(block)
            ok = done.returncode == 0 and (expected is None
                                           or output_matches(expected.text, done.stdout))
            if ok or "wait" not in block.options or time.monotonic() > deadline:
                break
            self.assert_alive()
            time.sleep(2.0)
        assert done.returncode == 0, (f"{block.where(self.page)} exited {done.returncode}:\n"
                                      f"{block.text}\n--- output ---\n{done.stdout[-4000:]}")
        if expected is not None:
            assert output_matches(expected.text, done.stdout), (
                f"{block.where(self.page)} did not print {expected.where(self.page)}:\n"
                f"--- expected ---\n{expected.text}--- printed ---\n{done.stdout[-4000:]}")
        self.transcript.append((block, done.stdout))
        return done.stdout

    def steps(self) -> Iterator[tuple[Block, Block | None]]:
        """Each block to play, with the output block it must print (if one follows)."""
        found = blocks(self.page)
        for i, block in enumerate(found):
            if block.lang not in _RUN_LANGS or "skip" in block.options:
                if "skip" in block.options:
                    assert block.options["skip"], f"{block.where(self.page)}: skip needs a reason"
                continue
            after = found[i + 1] if i + 1 < len(found) else None
            expected = after if after is not None and "output" in after.options else None
            yield block, expected

    def run(self) -> list[tuple[Block, str]]:
        """Play every block in order; stop the shells' workers at the end of the page."""
        try:
            for block, expected in self.steps():
                if "save" in block.options:
                    assert block.lang == "python", f"{block.where(self.page)}: save a python block"
                    (self.cwd(block.shell) / block.options["save"]).write_text(block.text)
                    continue
                self.run_block(block, expected)
            self.stop_all()
        finally:
            for proc, _block in self.background.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate()
        return self.transcript
