"""Newcomer mistakes against real PostgreSQL and Kafka: every command gives the same exit
code and the same one line for the same mistake, and never a traceback."""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.cli_output import one_line
from tests.integration.observability_support import run_fencectl
from tests.integration.workers import create_topic, fresh_schema, unique

pytestmark = pytest.mark.integration


def fencectl(*args: str, env: dict[str, str] | None = None,
             timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return run_fencectl(*args, env={"OTEL_TRACES_EXPORTER": "none", **(env or {})},
                        timeout_s=timeout_s)


def _with_password(dsn: str, password: str) -> str:
    parts = urlsplit(dsn)
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.split(':')[0]}:{password}@{host}"))


@pytest.fixture(scope="module")
def target(services: Any) -> tuple[str, str]:
    topic = unique("mistake")
    create_topic(services.kafka_bootstrap, topic, 1)
    return topic, asyncio.run(fresh_schema(services.dsn))


def test_wrong_password_is_exit_2_with_the_same_line_everywhere(
        services: Any, target: tuple[str, str]) -> None:
    topic, schema = target
    secret = "Wr0ngPassw0rd"
    env = {"FENCE_DSN": _with_password(services.dsn, secret)}
    commands = {
        "migrate": ["migrate", "--schema", schema],
        "status": ["status", "--schema", schema],
        "reset": ["reset", "accept-gap", "--group", "g", "--topic", topic, "--schema", schema],
        "run": ["run", "--topic", topic, "--group", unique("g"), "--schema", schema],
    }
    lines = {}
    for name, argv in commands.items():
        done = fencectl(*argv, env=env)
        assert done.returncode == 2, (name, done.stderr[-2000:])
        assert secret not in done.stdout + done.stderr
        line = one_line(done)
        assert line.startswith(f"fencectl {name}: FENCE_DSN: PostgreSQL refused the connection")
        lines[name] = line.split(": ", 1)[1]
    assert len(set(lines.values())) == 1, lines


async def _add_group(dsn: str, schema: str, group: str, topic: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'INSERT INTO "{schema}".partitions (group_id, topic, partition,'
                           " frontier) VALUES ($1, $2, 0, 0)", group, topic)
    finally:
        await conn.close()


def test_unknown_group_is_exit_2_listing_known_groups(
        services: Any, target: tuple[str, str]) -> None:
    topic, _ = target
    schema = asyncio.run(fresh_schema(services.dsn))
    empty = fencectl("status", "--group", "billing", "--schema", schema)
    assert empty.returncode == 2
    assert "no group has fence rows" in one_line(empty)
    asyncio.run(_add_group(services.dsn, schema, "billing", topic))
    asyncio.run(_add_group(services.dsn, schema, "shipping", topic))
    for argv in (["status", "--group", "biling"], ["status", "--group", "biling", "--json"],
                 ["status", "--history", "--topic", topic, "--partition", "0", "--group",
                  "biling"],
                 ["reset", "accept-gap", "--group", "biling", "--topic", topic]):
        done = fencectl(*argv, "--schema", schema)
        assert done.returncode == 2, (argv, done.stderr)
        line = one_line(done)
        assert "--group biling: unknown group" in line and "known groups: billing, shipping" \
            in line, line
    known = fencectl("status", "--group", "billing", "--schema", schema)
    assert known.returncode == 0, known.stderr
    assert "billing" in known.stdout


def test_unknown_librdkafka_property_exits_2_naming_it(target: tuple[str, str]) -> None:
    """Item 1 of issue 17: the worker must not hang on a property librdkafka refuses.
    (``subprocess.run`` kills it and raises ``TimeoutExpired`` after 20 s.)"""
    topic, schema = target
    started = time.monotonic()
    done = fencectl("run", "--topic", topic, "--group", unique("g"), "--schema", schema,
                    "-X", "no.such.property=1", timeout_s=20)
    assert time.monotonic() - started < 20
    assert done.returncode == 2, done.stderr[-3000:]
    assert "no.such.property" in one_line(done)


@pytest.mark.parametrize(("query", "reason"), [
    ("sslmode=require", 'rejected SSL upgrade: the server does not speak TLS, or sslmode asks'),
    ("sslmode=verify-full&sslrootcert=/nonexistent/ca.pem", "a TLS file cannot be read"),
], ids=["server-without-tls", "missing-root-cert"])
def test_a_tls_mistake_in_the_dsn_is_exit_2_at_once(services: Any, target: tuple[str, str],
                                                    query: str, reason: str) -> None:
    """A TLS setting of FENCE_DSN the server or the file system refuses is a configuration
    mistake: exit 2 naming the TLS settings, before --outage-bound-s (not retried as an
    unanswering server, exit 5)."""
    topic, schema = target
    dsn = services.dsn + ("&" if "?" in services.dsn else "?") + query
    started = time.monotonic()
    done = fencectl("run", "--topic", topic, "--group", unique("g"), "--schema", schema,
                    "--outage-bound-s", "30", env={"FENCE_DSN": dsn})
    assert done.returncode == 2, done.stderr[-2000:]
    assert time.monotonic() - started < 20
    line = one_line(done)
    assert line.startswith("fencectl run: FENCE_DSN: TLS: "), line
    assert reason in line and line.endswith("check sslmode, sslrootcert, sslcert and sslkey "
                                            "in FENCE_DSN"), line
