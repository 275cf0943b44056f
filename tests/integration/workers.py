"""Test support for worker integration tests: topics, production, worker subprocesses, state.

Worker processes are real ``fencectl run`` subprocesses; the helpers only start, signal
and wait for the pids they started. Group setups are the three the issue names.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
from confluent_kafka import KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from fencing.postgres.schema import migrate
from fencing.testing.pgproxy import Action, PgProxy, Rule
from fencing.types import SourceRecord
from ops.reference import generate, to_source_records
from ops.reference.generate import GeneratedRecord
from ops.reference.oracle import check
from ops.reference.snapshot import pg_state
from tests.polling import wait_until

__all__ = [
    "GROUP_SETUPS",
    "GroupSetup",
    "ProxyThread",
    "WorkerProc",
    "committed_total",
    "create_topic",
    "durable_rows",
    "exactly_once_problems",
    "fresh_schema",
    "produce",
    "run_until_committed",
    "unique",
    "wait_until",
]

ROOT = Path(__file__).resolve().parents[2]
FENCECTL = [sys.executable, "-m", "ops.cli"]
ARTIFACTS = ROOT / "artifacts" / "test-workers"


@dataclass(frozen=True, slots=True)
class GroupSetup:
    name: str
    args: tuple[str, ...]


# Fast group settings: 2 s sessions on the classic protocol; KIP-848 timeouts are broker-side
# (the local stack sets group.consumer.session.timeout.ms=6000, heartbeat 500 ms).
_CLASSIC_FAST = ("-X", "session.timeout.ms=2000", "-X", "heartbeat.interval.ms=300")
GROUP_SETUPS = (
    GroupSetup("eager-range", ("--group-protocol", "classic", "--assignment-strategy", "range",
                               *_CLASSIC_FAST)),
    GroupSetup("cooperative-sticky", ("--group-protocol", "classic", "--assignment-strategy",
                                      "cooperative-sticky", *_CLASSIC_FAST)),
    GroupSetup("kip848-consumer", ("--group-protocol", "consumer")),
)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, topic: str, partitions: int, *, replication: int = 1) -> None:
    """Create ``topic`` and return once every partition's leader answers ``list_offsets``;
    ``replication`` -1: the cluster's ``default.replication.factor``.

    Right after creation the broker can refuse ``list_offsets`` with UNKNOWN_LEADER_EPOCH
    ("Leader epoch is newer than broker epoch") while it applies the new metadata; a worker
    whose first assignment meets that exits 5 (Kafka facts unavailable)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, partitions, replication)])[topic]
    fut.result(timeout=30)
    wait_until(lambda: topic in admin.list_topics(timeout=5).topics, timeout_s=30,
               what=f"topic {topic}")

    def offsets_answer() -> bool:
        req = {KafkaTP(topic, p): OffsetSpec.latest() for p in range(partitions)}
        try:
            for fut in admin.list_offsets(req, request_timeout=5).values():
                fut.result(timeout=6)
        except KafkaException:
            return False
        return True

    wait_until(offsets_answer, timeout_s=30, what=f"the leaders of {topic} answering")


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(timeout=30)
    wait_until(lambda: topic not in admin.list_topics(timeout=5).topics, timeout_s=30,
               what=f"topic {topic} deleted")


def produce(bootstrap: str, records: Sequence[GeneratedRecord], *,
            headers: Sequence[tuple[str, bytes]] = ()) -> None:
    """Produce in order, idempotently (offsets 0, 1, ... per partition of a fresh topic)."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                  "linger.ms": 5, "batch.num.messages": 10000})
    for r in records:
        while True:
            try:
                p.produce(r.topic, r.value, r.key, partition=r.partition,
                          headers=list(headers) or None)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0, "records left unflushed"


def generated(topic: str, *, count: int, partitions: int, seed: int = 7,
              klass: str = "valid") -> tuple[list[GeneratedRecord], list[SourceRecord]]:
    recs = generate(seed, count=count, partitions=partitions, klass=klass,  # type: ignore[arg-type]
                    topic=topic)
    return recs, to_source_records(recs)


@asynccontextmanager
async def _connected(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def fresh_schema(dsn: str) -> str:
    schema = unique("fw").lower()
    async with _connected(dsn) as conn:
        await migrate(conn, schema)
    return schema


async def durable_rows(dsn: str, schema: str, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (epoch, frontier) from the fence table."""
    async with _connected(dsn) as conn:
        rows = await conn.fetch(
            f'SELECT partition, epoch, frontier FROM "{schema}".partitions '
            "WHERE group_id = $1 AND topic = $2", group, topic)
    return {r["partition"]: (r["epoch"], r["frontier"]) for r in rows}


async def journal_rows(dsn: str, schema: str, group: str, topic: str) -> list[dict[str, Any]]:
    async with _connected(dsn) as conn:
        rows = await conn.fetch(
            f'SELECT partition, event, epoch, lifetime, detail FROM "{schema}".journal '
            "WHERE group_id = $1 AND topic = $2 ORDER BY id", group, topic)
    return [dict(r) for r in rows]


async def exactly_once_problems(dsn: str, schema: str, group: str, topic: str,
                                source: Sequence[SourceRecord], *,
                                require_complete: bool = True) -> list[str]:
    """Oracle check of committed effects against the source prefix below the frontiers."""
    rows = await durable_rows(dsn, schema, group, topic)
    frontiers = {(topic, p): f for p, (_e, f) in rows.items()}
    async with _connected(dsn) as conn:
        actual = await pg_state(conn, topic=topic, schema=schema, group_id=group)
    problems = list(check(source, frontiers, actual))
    if require_complete:
        ends: dict[int, int] = {}
        for r in source:
            ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
        for p, end in ends.items():
            got = frontiers.get((topic, p))
            if got != end:
                problems.append(f"partition {p}: frontier {got}, expected {end}")
    return problems


def committed_total(dsn: str, schema: str, group: str, topic: str) -> int:
    """Records committed so far: the sum of the durable frontiers of ``topic``."""
    rows = asyncio.run(durable_rows(dsn, schema, group, topic))
    return sum(f for _e, f in rows.values())


class WorkerProc:
    """One ``fencectl run`` subprocess; its log goes to ``artifacts/test-workers/``."""

    def __init__(self, *, topic: str | None, group: str, schema: str, setup: GroupSetup,
                 extra: Sequence[str] = (), env: dict[str, str] | None = None,
                 name: str = "w", log_dir: Path | None = None,
                 command: Sequence[str] = FENCECTL) -> None:
        """``command``: the ``fencectl`` to run (a test may run a patched one);
        ``log_dir``: where the log goes (default ``artifacts/test-workers/``); ``topic``
        None: no ``--topic`` (``extra`` gives a ``--topic-pattern``)."""
        log_dir = log_dir or ARTIFACTS
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{group}-{name}-{uuid.uuid4().hex[:6]}.log"
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env.setdefault("OTEL_TRACES_EXPORTER", "none")
        full_env.update(env or {})
        named = ("--topic", topic) if topic is not None else ()
        self.argv = [*command, "run", *named, "--group", group, "--schema", schema,
                     "--shutdown-timeout-s", "10", *setup.args, *extra]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=full_env, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        self.pid = self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        """SIGTERM once the worker's ``main`` runs (its first log line: its SIGTERM handler
        is installed before it). Earlier, while Python still imports, SIGTERM's default
        action would end it (-15) instead of the worker's stop (exit 0). Waits at most 60 s."""
        deadline = time.monotonic() + 60
        while self.proc.poll() is None and self.log_path.stat().st_size == 0 \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def wait(self, timeout_s: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.poll() is not None:
                self._log.close()
        return code

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ensure_dead(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.kill()
            self.proc.wait(timeout=30)
        self._log.close()

    def owns_partitions(self) -> bool:
        return "assign {'partitions': [" in self.log()


class ProxyThread:
    """A ``PgProxy`` on its own event loop thread, so worker subprocesses can use it."""

    def __init__(self, dsn: str) -> None:
        parts = urlsplit(dsn)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.proxy = self._call(PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
                                .start())
        self.dsn = self.proxy.dsn(dsn)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def add_rule(self, needle: str, action: Action, times: int, *, exact: bool = False) -> Rule:
        async def add() -> Rule:
            return self.proxy.add_rule(needle, action, times=times, exact=exact)
        return self._call(add())

    def refuse(self, refusing: bool) -> None:
        """Drop every connection and refuse new ones (True), or listen again (False)."""
        self._call(self.proxy.refuse(refusing))

    def close(self) -> None:
        self._call(self.proxy.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def stop_live(procs: Sequence[WorkerProc], timeout_s: float = 30.0) -> None:
    """SIGTERM every member still alive, then assert each exits 0 within ``timeout_s``."""
    live = [w for w in procs if w.alive()]
    for w in live:
        w.terminate()
    for w in live:
        assert w.wait(timeout_s) == 0, w.log()[-3000:]


def run_until_committed(*, topic: str, group: str, schema: str, dsn: str, setup: GroupSetup,
                        total: int, extra: Sequence[str] = ()) -> str:
    """Run one worker until ``total`` records are committed, stop it with SIGTERM (it must
    exit 0), return its log."""
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, extra=extra)
    try:
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= total,
                   timeout_s=60, what=f"{total} records committed")
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
    return w.log()


def crash_kafka(settings: Any, while_down: Callable[[], Any] = lambda: None) -> None:
    """The local stack's Kafka broker lost (SIGKILL: its log recovered at the next start),
    ``while_down`` run, then the broker started again (``settings``: the stack's,
    ``ops.stack.config.settings_from``). A test calling it is ``exclusive``."""
    _crash(settings, "KAFKA", signal.SIGKILL, "kafka", while_down)


def crash_postgres(settings: Any) -> None:
    """An immediate shutdown of the local stack's PostgreSQL (SIGQUIT: no checkpoint, crash
    recovery at the next start), then started again. A test calling it is ``exclusive``."""
    _crash(settings, "POSTGRES", signal.SIGQUIT, "postgres", lambda: None)


def _crash(settings: Any, service: str, sig: signal.Signals, port: str,
           while_down: Callable[[], Any]) -> None:
    from ops.stack import control as stack
    from ops.stack.config import Service
    from ops.stack.procs import port_free, stop_pid
    from ops.stack.procs import wait_until as until

    which = Service[service]
    row = {r.service: r for r in stack.status(settings)}[which]
    assert row.pid is not None, f"the stack's {which.value} is not running"
    stop_pid(row.pid, sig=sig, grace_s=30.0)
    until(lambda: port_free(getattr(settings.ports, port)), timeout_s=30.0)
    while_down()
    stack.up(settings, services=[which], out=lambda line: None)
