"""Connectors of the local stack's Kafka Connect (``fencectl stack up --with debezium``)
through its REST API, and the replication slots Debezium's PostgreSQL connector leaves on
the source: registered, waited for, deleted, dropped (the CDC tests' and the CDC bench's).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import asyncpg

__all__ = [
    "delete_connector",
    "drop_slot",
    "execute",
    "failed",
    "http",
    "postgres_connector",
    "register_connector",
    "restart_failed",
]


def postgres_connector(source_dsn: str, prefix: str, table: str) -> dict[str, str]:
    """The config of Debezium's PostgreSQL connector reading ``public.TABLE`` of
    ``source_dsn`` (pgoutput, a filtered publication and a slot named after ``prefix``,
    topics ``PREFIX.public.TABLE`` of 3 partitions, truncates sent: ``skipped.operations``
    is ``t`` by default)."""
    url = urlsplit(source_dsn)
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": url.hostname or "127.0.0.1", "database.port": str(url.port),
        "database.user": url.username or "", "database.password": url.password or "",
        "database.dbname": url.path.lstrip("/"), "topic.prefix": prefix,
        "plugin.name": "pgoutput", "slot.name": f"{prefix}_slot",
        "publication.name": f"{prefix}_pub", "publication.autocreate.mode": "filtered",
        "table.include.list": f"public.{table}", "snapshot.mode": "initial",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "3",
        "skipped.operations": "none",
    }


def http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read()
    return json.loads(text) if text else None


def register_connector(connect_url: str, name: str, config: dict[str, str], *,
                       timeout_s: float = 120.0) -> None:
    """``PUT /connectors/NAME/config``, then wait until its task runs."""
    http("PUT", f"{connect_url}/connectors/{name}/config", config)
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = http("GET", f"{connect_url}/connectors/{name}/status")
            tasks = last.get("tasks") or []
            if tasks and all(t.get("state") == "RUNNING" for t in tasks):
                return
            if failed(last):
                raise AssertionError(f"connector {name} failed: {last}")
        except urllib.error.HTTPError:
            pass
        time.sleep(1.0)
    raise AssertionError(f"connector {name} not running within {timeout_s} s: {last}")


def restart_failed(connect_url: str, name: str) -> bool:
    """Restart the connector's FAILED tasks (``POST /connectors/NAME/restart?includeTasks=true
    &onlyFailed=true``, KIP-745) and say whether there was one. Debezium's PostgreSQL task
    that starts while its database is shutting down fails in its ``start`` (``Couldn't
    get timestamp utils from underlying connection``, caused by ``FATAL: the database system
    is shutting down``) and Kafka Connect does not restart a failed task: an operator, or a
    monitor acting for one, does. A task running when the database goes away retries by
    itself (``errors.max.retries``)."""
    try:
        status = http("GET", f"{connect_url}/connectors/{name}/status")
    except (urllib.error.URLError, OSError):
        return False                  # Connect itself restarting: its tasks start anew
    if not failed(status):
        return False
    http("POST", f"{connect_url}/connectors/{name}/restart?includeTasks=true&onlyFailed=true")
    return True


def failed(status: Any) -> bool:
    """Whether a ``GET /connectors/NAME/status`` answer shows the connector or a task
    ``FAILED`` (what ``restart_failed`` restarts)."""
    states = [status.get("connector", {}).get("state"),
              *(t.get("state") for t in status.get("tasks") or [])]
    return "FAILED" in states


def delete_connector(connect_url: str, name: str, *, timeout_s: float = 30.0) -> None:
    """Stop the connector, delete its source offsets, then the connector (KIP-875): a
    connector deleted with its offsets left in Connect's offsets topic would find them
    again when one of its name is registered, and Debezium then refuses to start from a
    position its new slot no longer has (``… but this is no longer available on the
    server``)."""
    base = f"{connect_url}/connectors/{name}"
    try:
        http("PUT", f"{base}/stop")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return
        raise
    deadline = time.monotonic() + timeout_s
    while True:  # the offsets can be deleted once the connector and its tasks are stopped
        try:
            http("DELETE", f"{base}/offsets")
            break
        except urllib.error.HTTPError as exc:
            if exc.code not in (400, 409) or time.monotonic() > deadline:
                raise
        time.sleep(0.5)
    try:
        http("DELETE", base)
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise


async def execute(dsn: str, *statements: str) -> None:
    """Run ``statements`` in order on one connection of ``dsn`` (each autocommit): a source
    table's DDL and changes, a target's set-up."""
    conn = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def drop_slot(source_dsn: str, slot: str, *, timeout_s: float = 60.0) -> None:
    """Drop the replication slot ``slot`` once its connector let go of it (a slot kept would
    hold the source's WAL, and the slots are few: ``max_replication_slots``)."""
    conn = await asyncpg.connect(source_dsn)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            active = await conn.fetchval(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot)
            if active is None:
                return
            if not active:
                await conn.execute("SELECT pg_drop_replication_slot($1)", slot)
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"replication slot {slot} still active after {timeout_s} s")
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


