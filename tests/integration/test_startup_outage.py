"""Start-up while PostgreSQL recovers (issue 24, item 3): a server that does not answer or
drops the connection is retried within ``--outage-bound-s``; a refused login is a
configuration mistake (exit 2 at once).

PostgreSQL "down" is a real TCP proxy in front of the stack's server (``ProxyThread``): while
it refuses, connections are refused; while its upstream is a closed port, it accepts and
drops every connection (asyncpg: "unexpected connection_lost() call", what a client sees of
a restarting server). Then it forwards to the real server again.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.integration.workers import (
    FENCECTL,
    GROUP_SETUPS,
    ROOT,
    ProxyThread,
    WorkerProc,
    committed_total,
    create_topic,
    fresh_schema,
    generated,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

SETUP = GROUP_SETUPS[1]
DOWN_S = 10.0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def topic(services: Any) -> tuple[str, str, str]:
    name, group = unique("startup"), unique("gstartup")
    create_topic(services.kafka_bootstrap, name, 2)
    recs, _src = generated(name, count=200, partitions=2)
    produce(services.kafka_bootstrap, recs)
    return name, group, asyncio.run(fresh_schema(services.dsn))


@pytest.fixture
def proxy(services: Any) -> Iterator[ProxyThread]:
    p = ProxyThread(services.dsn)
    try:
        yield p
    finally:
        p.close()


@pytest.mark.parametrize("how", ["refused", "dropped"])
def test_member_started_while_postgres_is_down_comes_up_when_it_returns(
        services: Any, topic: tuple[str, str, str], proxy: ProxyThread, how: str) -> None:
    name, group, schema = topic
    upstream = proxy.proxy.upstream
    if how == "refused":
        proxy.refuse(True)
    else:
        proxy.proxy.upstream = ("127.0.0.1", _closed_port())
    w = WorkerProc(topic=name, group=group, schema=schema, setup=SETUP,
                   env={"FENCE_DSN": proxy.dsn}, name=how)
    try:
        wait_until(lambda: "PostgreSQL not answering at start" in w.log() or not w.alive(),
                   timeout_s=60, what="the member retrying PostgreSQL")
        time.sleep(DOWN_S)  # PostgreSQL comes back 10 s after the member first found it down
        assert w.alive(), w.log()[-3000:]
        if how == "refused":
            proxy.refuse(False)
        else:
            proxy.proxy.upstream = upstream
        wait_until(lambda: committed_total(services.dsn, schema, group, name) == 200,
                   timeout_s=90, what="the member processing once PostgreSQL is back")
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()


def _run(services: Any, topic: tuple[str, str, str], dsn: str,
         *extra: str) -> tuple[int, str, float]:
    name, group, schema = topic
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FENCE_DSN": dsn,
           "OTEL_TRACES_EXPORTER": "none"}
    t0 = time.monotonic()
    done = subprocess.run([*FENCECTL, "run", "--topic", name, "--group", group, "--schema",
                           schema, *SETUP.args, *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, done.stderr, time.monotonic() - t0


def test_wrong_password_exits_2_at_once(services: Any, topic: tuple[str, str, str]) -> None:
    parts = urlsplit(services.dsn)
    wrong = urlunsplit(parts._replace(netloc=f"{parts.username}:NotThePassword9@"
                                             f"{parts.hostname}:{parts.port}"))
    code, err, took_s = _run(services, topic, wrong, "--outage-bound-s", "60")
    assert code == 2, err[-3000:]
    assert "PostgreSQL refused the connection" in err and "password" in err, err[-3000:]
    assert "NotThePassword9" not in err
    assert took_s < 30, f"a refused login took {took_s:.0f} s: it must not be retried"
    assert "not answering at start" not in err


def test_postgres_down_past_the_bound_exits_5_naming_it(
        services: Any, topic: tuple[str, str, str], proxy: ProxyThread) -> None:
    proxy.proxy.upstream = ("127.0.0.1", _closed_port())
    code, err, _took = _run(services, topic, proxy.dsn, "--outage-bound-s", "4")
    assert code == 5, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("fencectl run: FENCE_DSN: PostgreSQL did not answer or dropped the "
                           "connection"), last
    assert "at start (--outage-bound-s 4); check the host and port in FENCE_DSN" in last, last
