"""The layering, pinned: which package may import what (docs/ARCHITECTURE.md, "Rules"),
and the import graph of ``consumer/``, ``fencing/`` and ``ops/`` has no cycle.

Every import statement of every module counts, also those inside functions and under
``TYPE_CHECKING``. In the graph, ``from package import name`` is an edge to
``package.name`` when that is a module, else to ``package``. Ties the graph would not see
are ruled out too:

- a handler named by a ``"module:name"`` string is an import hidden from the graph: specs
  are spelled from the imported object (``ops.commands.run.DEFAULT_HANDLER``);
- ``ops/stack`` stands alone also transitively, and ``ops/stack`` and ``ops/sim`` take the
  CLI's name for their hints as a parameter (``ops.hints`` stays with the commands);
- ``ops.testing`` is gone: the wire proxy is ``fencing.testing.pgproxy``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (absolute imports only)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _violations(package: str, forbidden: tuple[str, ...], *,
                allowed_under: tuple[str, ...] = ()) -> list[str]:
    out = []
    for path in _modules(package):
        rel = path.relative_to(ROOT).as_posix()
        if any(rel.startswith(prefix) for prefix in allowed_under):
            continue
        for name in sorted(_imports(path)):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                out.append(f"{rel} imports {name}")
    return out


@pytest.mark.parametrize(("package", "forbidden", "allowed_under", "why"), [
    ("fencing", ("consumer", "ops"), (), "fencing is the base layer"),
    ("consumer", ("ops",), (), "consumer never reaches into the operator tooling"),
    ("fencing", ("asyncpg",), ("fencing/postgres/",),
     "only the PostgreSQL store knows asyncpg; the core and the memory store do not"),
    ("fencing", ("confluent_kafka",), ("fencing/postgres/sink/registry.py",
                                       "fencing/postgres/sink/formats.py",
                                       "fencing/postgres/sink/messages.py"),
     "the fence knows nothing of Kafka clients"),
    ("consumer", ("confluent_kafka",), ("consumer/kafka/",),
     "librdkafka stays in the Kafka adapter; its errors are translated there"),
    ("consumer", ("asyncpg",), (), "the worker reaches PostgreSQL only through the store"),
    ("fencing", ("opentelemetry",), (), "instrumentation lives at the edge"),
    ("consumer", ("opentelemetry",), ("consumer/observability/",),
     "the lifecycle and the worker emit events and open spans through a port"),
    ("ops/stack", ("consumer", "fencing"), (), "the service stack stands alone"),
    ("ops/stack", ("ops.hints",), (), "the CLI passes its name for hints in (StackSettings.cli)"),
    ("ops/sim", ("ops.hints",), (), "the CLI passes its name for replay commands in (cli=)"),
    ("consumer", ("ops.testing",), (), "ops.testing is gone: fencing.testing"),
    ("ops", ("ops.testing",), (), "ops.testing is gone: fencing.testing"),
    ("tests", ("ops.testing",), (), "ops.testing is gone: fencing.testing"),
])
def test_import_boundary(package: str, forbidden: tuple[str, ...],
                         allowed_under: tuple[str, ...], why: str) -> None:
    assert _violations(package, forbidden, allowed_under=allowed_under) == [], why


def test_the_table_sinks_formats_use_only_the_schema_registry_half_of_confluent_kafka() -> None:
    """The sink's schema'd formats decode with confluent-kafka's schema registry client and
    serdes (pure Python: httpx, fastavro, protobuf, jsonschema), never librdkafka."""
    allowed = ("confluent_kafka.schema_registry", "confluent_kafka.serialization")
    used = {name for path in _modules("fencing/postgres/sink") for name in _imports(path)
            if name == "confluent_kafka" or name.startswith("confluent_kafka.")}
    assert used and all(name.startswith(allowed) for name in used), used


def test_the_rules_see_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import asyncpg\n    from ops.cli import main\n")
    assert _imports(module) == {"asyncpg", "ops.cli"}


def test_no_module_is_over_300_lines_without_a_reason() -> None:
    """A longer module says why at its top ("Long because ...")."""
    long = []
    for package in ("consumer", "fencing", "ops"):
        for path in _modules(package):
            text = path.read_text()
            if text.count("\n") > 330 and "Long because" not in text[:3000]:
                long.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
    assert long == []


# -- the import graph -------------------------------------------------------------------------
PACKAGES = ("consumer", "fencing", "ops")
#: the one cycle left, removed by issue 26's worker step (LifetimeRun's back-pointer)
KNOWN = frozenset({"consumer.lifetime_run", "consumer.worker"})


def modules(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module's imports of modules of the same packages (every import statement)."""
    mods = modules(root)
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in mods:
                        edges.add(full)
                    elif node.module in mods:
                        edges.add(node.module)
        edges.discard(name)
        out[name] = edges
    return out


def cycles(g: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


def reach(g: dict[str, set[str]], starts: Iterable[str]) -> set[str]:
    seen, todo = set(), list(starts)
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo.extend(g.get(v, ()))
    return seen


def test_no_import_cycle_besides_the_known_one() -> None:
    assert [sorted(c) for c in cycles(graph()) if c != KNOWN] == []


@pytest.mark.xfail(strict=True, reason="consumer.worker <-> consumer.lifetime_run: LifetimeRun "
                   "keeps a back-pointer to Worker (issue 26 item 4, the worker step); remove "
                   "this mark when that cycle is cut")
def test_no_import_cycle_at_all() -> None:
    assert cycles(graph()) == []


def test_the_walker_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    """The bench's old circle: a child module importing its parent's helper inside a function."""
    bench = tmp_path / "ops" / "bench"
    bench.mkdir(parents=True)
    (tmp_path / "ops" / "__init__.py").write_text("")
    (bench / "__init__.py").write_text("")
    (bench / "baselines.py").write_text("from ops.bench.child import read\n")
    (bench / "child.py").write_text("def main():\n    from ops.bench.baselines import _c\n")
    (bench / "leaf.py").write_text("import ops.bench.child\n")
    assert cycles(graph(tmp_path)) == [frozenset({"ops.bench.baselines", "ops.bench.child"})]


def test_ops_stack_reaches_neither_consumer_nor_fencing_transitively() -> None:
    g = graph()
    stack = [m for m in g if m.startswith("ops.stack")]
    reached = sorted(m for m in reach(g, stack) if m.split(".")[0] in ("consumer", "fencing"))
    assert reached == [], "the service stack stands alone, also through what it imports"


def test_ops_testing_is_gone() -> None:
    assert not (ROOT / "ops" / "testing").exists(), "the wire proxy is fencing.testing.pgproxy"


_SPEC = re.compile(r"\b(consumer|fencing|ops)(\.\w+)+:\w+\b")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            out.add(id(node.body[0].value))
    return out


def test_no_handler_is_named_by_a_string() -> None:
    """``"ops.reference.pg:reference"`` in the code would load a module the graph cannot see."""
    found = []
    for path in modules(ROOT).values():
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docs and _SPEC.search(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == []


def test_the_default_handler_is_an_import_the_graph_sees() -> None:
    from ops.commands.run import DEFAULT_HANDLER, SINK_HANDLER

    assert DEFAULT_HANDLER == "ops.reference.pg:reference"
    assert SINK_HANDLER == "fencing.postgres.sink:table_sink"
    g = graph()
    assert "ops.reference.pg" in g["ops.commands.run"]
    assert "fencing.postgres.sink" in g["ops.operator.handler_record"]
    assert "ops.operator.handler_record" in g["ops.commands.run"]
    assert "DEFAULT_HANDLER" not in (ROOT / "consumer" / "config.py").read_text()
