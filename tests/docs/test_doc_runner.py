"""The page runner itself (``tests/doc_runner.py``): marks, output matching, shells that keep
their state, a background block stopped as Ctrl-C stops it — without services."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.doc_pages import DOCS, README
from tests.doc_runner import PageRun, blocks, output_matches
from tests.integration.test_doc_pages import PAGES

PAGE = """# A page

<!-- run: skip="not here" -->
```bash
exit 1
```

```bash
mkdir -p sub && cd sub && export GREETING=hello
```

<!-- run: save=mod.py -->
```python
VALUE = 41
```

<!-- run: shell=2 -->
```bash
echo "second shell in $(basename "$PWD")"
```

```python
import mod
print(mod.VALUE + 1)
```

<!-- run: output -->
```text
42
```

<!-- run: background -->
```bash
python - <<'EOF'
import os, time
try:
    print(os.environ["GREETING"], "from", os.path.basename(os.getcwd()), flush=True)
    open(os.path.join(os.environ["HOME"], "ready"), "w").close()
    time.sleep(600)
except KeyboardInterrupt:
    print("stopped")
EOF
```

<!-- run: shell=2 -->
```bash
while [ ! -f "$HOME/ready" ]; do sleep 0.1; done
```

```bash
echo "after the worker: $GREETING"
```

<!-- run: output -->
```text
after the worker: hello
```
"""


def test_output_matching_takes_ellipses_and_ignores_trailing_spaces() -> None:
    out = "ALTER TABLE\nreplaying x (lt-42)\nnoise\nreplay: 1 applied   \n id | a \n"
    assert output_matches("ALTER TABLE\nreplaying x (lt-…)\n…\nreplay: 1 applied\n", out)
    assert output_matches(" id | a\n", out)
    assert not output_matches("replay: 2 applied\n", out)
    assert not output_matches("ALTER TABLE\nreplay: 1 applied\n", out), "lines are together"
    assert not output_matches("replay: 1\n", out), "a line matches whole"


def test_blocks_carry_their_marks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    found = blocks(page)
    assert [(b.lang, dict(b.options)) for b in found][:4] == [
        ("bash", {"skip": "not here"}), ("bash", {}), ("python", {"save": "mod.py"}),
        ("bash", {"shell": "2"})]
    (page := tmp_path / "bad.md").write_text("<!-- run: sometimes -->\n```bash\ntrue\n```\n")
    with pytest.raises(ValueError, match="unknown run option 'sometimes'"):
        blocks(page)


def test_a_page_plays_in_order_with_shells_that_keep_their_state(tmp_path: Path) -> None:
    """The page's worker is a Python process in the shell's foreground, as a reader's
    ``fencectl run`` is: Ctrl-C raises KeyboardInterrupt in it wherever it is, and bash,
    whose child did not die of the signal, goes on and exits 0. (A loop of ``sleep``
    children in bash lost a Ctrl-C that landed while bash forked one: bash acts on SIGINT
    only if its child died of it.)"""
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    (tmp_path / "start").mkdir()
    (tmp_path / "work").mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    run = PageRun(page, start=tmp_path / "start", env=env, work=tmp_path / "work")
    outputs = [out for _block, out in run.run()]
    assert outputs[0] == ""  # mkdir/cd/export
    assert outputs[1] == "second shell in start\n"  # a second shell starts where the page does
    assert outputs[2] == "42\n"  # the saved module sits in shell 1's folder: sub/
    assert outputs[3] == ""  # shell 2 waited for the worker's first line
    assert outputs[4] == "hello from sub\nstopped\n"  # Ctrl-C'd before the next block of shell 1
    assert outputs[5] == "after the worker: hello\n"
    assert (tmp_path / "start" / "sub" / "mod.py").read_text() == "VALUE = 41\n"


def test_a_background_block_stops_on_ctrl_c_when_the_runner_ignores_it(
        tmp_path: Path) -> None:
    """The runner's process ignoring SIGINT (as a pytest worker was once left) does not pass
    that on to the page's worker: one Ctrl-C still stops it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        test_a_page_plays_in_order_with_shells_that_keep_their_state(tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_failing_block_or_a_missed_output_fails_the_page(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    page = tmp_path / "fails.md"
    page.write_text("```bash\necho one\nfalse\necho two\n```\n")
    with pytest.raises(AssertionError, match="exited 1"):
        PageRun(page, start=tmp_path, env=env, work=tmp_path / "work").run()
    page.write_text("```bash\necho one\n```\n\n<!-- run: output -->\n```text\ntwo\n```\n")
    with pytest.raises(AssertionError, match="did not print"):
        PageRun(page, start=tmp_path, env=env, work=tmp_path / "work").run()


def test_every_runnable_page_marks_only_known_options() -> None:
    for name in PAGES:
        path = README if name == "README.md" else DOCS / name
        for block in blocks(path):
            assert block.lang, f"{name}:{block.line}: a code block names its language"
