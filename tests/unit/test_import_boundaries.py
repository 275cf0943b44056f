"""The layering, pinned: which package may import what (docs/ARCHITECTURE.md, "Rules").

Every import statement of every module counts, also those inside functions.
"""

from __future__ import annotations

import ast
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
