"""The pages a new user follows, run exactly as written, top to bottom (``tests/doc_runner.py``).

Every ```` ```bash ```` and ```` ```python ```` block of README.md, the quick start, the
tutorials, "Writing a handler" and "Test your own handler" runs in the order a reader meets
it, in shells whose ``PATH`` holds no virtualenv and no ``PYTHONPATH`` until the page
itself activates ``.venv`` — a reader's terminal. A reader's own files (a handler module, a
test file) go in their home directory, outside the repository (``HOME`` is a fresh folder
per page). The stack's caches are the session's (``FENCE_CACHE_DIR``), so ``make
stack-up`` finds the services the session started; ``FENCE_SCHEMA`` gives each page a fence
schema of its own, and the page's tables and topics are dropped before and after it, so a
page meets what a fresh clone meets.

``make demo``, the README's first command, runs as typed from the clone. What each block
printed goes to ``artifacts/doc-pages/PAGE.txt``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.doc_pages import DOCS, README
from tests.doc_runner import PageRun, blocks
from tests.integration.workers import ROOT
from tests.polling import wait_until

# make stack-up starts every service; the pages run one after another in one worker (make
# test's --dist loadfile): they share fixed names (topic orders, port 9464)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("go_services")]

VENV_BIN = Path(sys.executable).parent
#: what a page leaves behind in Kafka and PostgreSQL (dropped before and after each page)
TOPICS = ("orders", "payments", "accounts", "shop.public.customers")
TABLES = ("public.orders", "public.order_totals", "public.balances", "public.accounts",
          "public.customers")
SUBJECTS = ("accounts-value", "accounts-key")
#: connection settings a reader's shell gets from the page (``eval "$(fencectl stack env)"``)
_CONNECTION = ("KAFKA_BOOTSTRAP_SERVERS", "FENCE_DSN", "FENCE_SCHEMA", "JAEGER_QUERY_URL",
               "SCHEMA_REGISTRY_URL", "PYTHONPATH", "VIRTUAL_ENV")

#: page -> does the reader start in the clone (README, quick start) or, already activated,
#: in a folder of their own (the guides a reader opens later)
PAGES = {
    "README.md": "clone",
    "quickstart.md": "clone",
    "tutorial-handler.md": "clone",
    "tutorial-avro.md": "clone",
    "tutorial-replication.md": "clone",
    "handlers.md": "home",
    "test-kit.md": "home",
}


def _page(name: str) -> Path:
    return README if name == "README.md" else DOCS / name


def reader_env(home: Path, *, activated: bool, schema: str) -> dict[str, str]:
    """A reader's terminal (80 columns): no connection settings, no virtualenv on PATH
    (unless the reader activated it already), HOME a folder of their own."""
    from ops.stack.config import settings_from

    cache = settings_from().paths.cache
    env = {k: v for k, v in os.environ.items()
           if k not in _CONNECTION and not k.startswith("OTEL_")}
    path = [p for p in env.get("PATH", "").split(os.pathsep)
            if p and Path(p).resolve() != VENV_BIN.resolve()]
    if activated:
        path.insert(0, str(VENV_BIN))
        env["VIRTUAL_ENV"] = str(VENV_BIN.parent)
    env.update({"PATH": os.pathsep.join(path), "HOME": str(home), "COLUMNS": "80",
                "FENCE_CACHE_DIR": str(cache), "FENCE_SCHEMA": schema})
    return env


def fresh_start(dsn: str, bootstrap: str, registry_url: str, schema: str) -> None:
    """What a fresh clone meets: none of the pages' topics, tables and schema subjects, no
    fence schema."""
    async def drop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for table in TABLES:
                await conn.execute(f"DROP TABLE IF EXISTS {table}")
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())
    registry = SchemaRegistryClient({"url": registry_url, "timeout": 30})
    for subject in SUBJECTS:  # a fresh registry: the sink creates a table from the latest
        if subject in registry.get_subjects():
            registry.delete_subject(subject)
            registry.delete_subject(subject, permanent=True)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    present = [t for t in TOPICS if t in admin.list_topics(timeout=10).topics]
    if present:
        for future in admin.delete_topics(present).values():
            future.result(timeout=30)
        wait_until(lambda: not set(present) & set(admin.list_topics(timeout=10).topics),
                   timeout_s=60, what=f"topics {present} deleted")


@pytest.fixture
def reader(services: Any, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    schema = f"page_{uuid.uuid4().hex[:8]}"
    fresh_start(services.dsn, services.kafka_bootstrap, services.schema_registry_url, schema)
    (tmp_path / "home").mkdir()
    (tmp_path / "shells").mkdir()
    try:
        yield tmp_path, schema
    finally:
        fresh_start(services.dsn, services.kafka_bootstrap, services.schema_registry_url, schema)


def test_every_page_listed_has_blocks_to_run() -> None:
    for name in PAGES:
        runnable = [b for b in blocks(_page(name)) if b.lang in ("bash", "python")
                    and "skip" not in b.options]
        assert runnable, f"{name} has no block to run"


@contextmanager
def _replication_page(request: pytest.FixtureRequest, name: str) -> Iterator[None]:
    """The replication tutorial's source side, as a fresh stack has it: no connector
    ``shop``, no slot or publication ``shop``, no source table (before and after the page);
    Kafka Connect runs under the session's lease (``debezium``), which the page's own
    ``fencectl stack up --with debezium`` finds running."""
    if name != "tutorial-replication.md":
        yield
        return
    from tests.integration.cdc import delete_connector, drop_slot

    debezium = request.getfixturevalue("debezium")

    def clean() -> None:
        delete_connector(debezium.connect_url, "shop")
        asyncio.run(drop_slot(debezium.source_dsn, "shop"))

        async def drop() -> None:
            conn = await asyncpg.connect(debezium.source_dsn)
            try:
                await conn.execute("DROP PUBLICATION IF EXISTS shop")
                await conn.execute("DROP TABLE IF EXISTS public.customers")
            finally:
                await conn.close()
        asyncio.run(drop())

    clean()
    try:
        yield
    finally:
        clean()


@pytest.mark.parametrize("name", list(PAGES))
def test_the_page_runs_as_written(reader: tuple[Path, str], name: str,
                                  request: pytest.FixtureRequest) -> None:
    with _replication_page(request, name):
        _run_page(reader, name)


def _run_page(reader: tuple[Path, str], name: str) -> None:
    tmp, schema = reader
    home = tmp / "home"
    in_clone = PAGES[name] == "clone"
    if not in_clone:
        (home / "work").mkdir()
    run = PageRun(_page(name), start=ROOT if in_clone else home / "work",
                  env=reader_env(home, activated=not in_clone, schema=schema),
                  work=tmp / "shells")
    log = ROOT / "artifacts" / "doc-pages" / f"{name}.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        transcript = run.run()
    finally:  # what each block printed, for a reader of a failure
        log.write_text("".join(f"---- {name}:{block.line} {dict(block.options)}\n{out}\n"
                               for block, out in run.transcript))
    assert transcript, f"{name}: nothing ran"


def test_make_demo(services: Any) -> None:
    """The README's first command, from the clone, as typed."""
    env = {k: v for k, v in os.environ.items() if k not in _CONNECTION}
    done = subprocess.run(["make", "demo"], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "Traceback" not in done.stdout + done.stderr
    out = done.stdout
    assert "worker-1 exited with 0" in out, out[-4000:]
    assert "== every record processed; fencectl status:" in out, out[-4000:]
    assert out.index("== ownership journal") < out.index("== all workers stopped"), out[-4000:]
