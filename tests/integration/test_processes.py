"""``fencectl run --processes N`` against real Kafka and PostgreSQL: N members of one group
drain a backlog exactly once (the reference oracle over the committed rows), each member
serves its own HTTP port and shows in ``fencectl status``; a SIGKILLed member is restarted
and the set still drains exactly once (per group protocol); SIGTERM to the parent drains
every member and exits 0; a member that exits with a code no restart fixes ends the set with
that code."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket

import pytest

from fencing.types import SourceRecord
from ops.stack.config import ServiceSettings
from tests.integration.observability_support import readyz, run_fencectl
from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    WorkerProc,
    committed_total,
    create_topic,
    exactly_once_problems,
    fresh_schema,
    generated,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

SETUP = GROUP_SETUPS[1]  # cooperative-sticky: the default assignor
HANDLERS = "tests.integration.handlers"
_STARTED = re.compile(r"member (\d+) started \(pid (\d+)\)")


def _members(w: WorkerProc) -> dict[int, list[int]]:
    """Member index -> the pids it was started with, in order (from the set's log)."""
    out: dict[int, list[int]] = {}
    for index, pid in _STARTED.findall(w.log()):
        out.setdefault(int(index), []).append(int(pid))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _two_free_ports() -> int:
    """A port P with P and P + 1 both free on loopback."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise AssertionError("no two consecutive free ports")


def _running(group: str, schema: str) -> set[int]:
    """Pids of the members ``fencectl status`` shows running (assignment positioned)."""
    got = run_fencectl("status", "--json", "--group", group, "--schema", schema)
    if got.returncode == 2 and "unknown group" in got.stderr:
        return set()  # no member has been assigned yet: no fence rows
    assert got.returncode == 0, (got.returncode, got.stderr[-2000:])
    return {m["pid"] for m in json.loads(got.stdout)["members"] if m.get("state") == "running"}


def _wait_all_running(w: WorkerProc, group: str, schema: str, n: int = 2) -> dict[int, list[int]]:
    """Wait until every member of the set runs (``fencectl status`` shows each of them)."""
    wait_until(lambda: len(pids := _members(w)) == n and _running(group, schema) == {
        p[-1] for p in pids.values()}, timeout_s=120, what=f"{n} members running")
    return _members(w)


def _stop(w: WorkerProc, timeout_s: float = 60) -> int:
    w.terminate()
    try:
        return w.wait(timeout_s)
    finally:
        w.ensure_dead()


def test_members_drain_a_backlog_exactly_once_and_stop_on_sigterm(services) -> None:
    topic, group = unique("procs"), unique("gprocs")
    create_topic(services.kafka_bootstrap, topic, 6)
    schema = asyncio.run(fresh_schema(services.dsn))
    recs, source = generated(topic, count=6000, partitions=6)
    port = _two_free_ports()
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP,
                   extra=("--processes", "2", "--http-port", str(port),
                          "--heartbeat-interval-s", "1"))
    try:
        # both members joined and own partitions (fencectl status shows every member)
        pids = _wait_all_running(w, group, schema)
        assert all(len(p) == 1 for p in pids.values()), w.log()
        children = {p[0] for p in pids.values()}
        # one HTTP port per member: the set's port + the member's index (each ready once
        # its assignment is positioned; a session lost on a loaded machine rebalances again)
        for i in (0, 1):
            url = f"http://127.0.0.1:{port + i}"

            def ready(url: str = url) -> bool:
                got = readyz(url)
                return got is not None and got[0] == 200
            wait_until(ready, timeout_s=60, what=f"member {i} ready on {url}")
        produce(services.kafka_bootstrap, recs)  # the backlog, for both to drain
        wait_until(lambda: committed_total(services.dsn, schema, group, topic) >= len(source),
                   timeout_s=120, what="the backlog committed")
        assert asyncio.run(exactly_once_problems(services.dsn, schema, group, topic,
                                                 source)) == []
        owners = asyncio.run(_owners(services.dsn, schema, group, topic))
        assert len(set(owners.values())) == 2 and len(owners) == 6, owners
        assert _stop(w) == 0, w.log()[-3000:]
        assert not any(_alive(p) for p in children)
        log = w.log()
        assert all(f"member {i} (pid {pids[i][0]}) exited 0" in log for i in (0, 1)), log[-3000:]
        assert ": restart " not in log and "; 0 restarts" in log
    finally:
        w.ensure_dead()


async def _owners(dsn: str, schema: str, group: str, topic: str) -> dict[int, str]:
    """Partition -> the lifetime that owns it (claimed it last) in the fence table."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f'SELECT partition, owner FROM "{schema}".partitions '
                                "WHERE group_id = $1 AND topic = $2", group, topic)
    finally:
        await conn.close()
    return {r["partition"]: r["owner"] for r in rows}


#: the slow reference handler: 20 records per batch, 0.2 s each, 4 at once per member: two
#: members drain at most ~800 records/s, so 4,000 take ~5 s even on an idle machine
SLOW = ("--handler", f"{HANDLERS}:slow_handler", "--batch-max-records", "20")
SLOW_ENV = {"FENCE_TEST_BATCH_DELAY_S": "0.2"}


def _slow_set(services: ServiceSettings, setup: GroupSetup
              ) -> tuple[WorkerProc, str, str, str, list[SourceRecord]]:
    """A set of 2 slow members, both running, then a backlog of 4,000 records produced."""
    topic, group = unique("procs"), unique("gprocs")
    create_topic(services.kafka_bootstrap, topic, 6)
    schema = asyncio.run(fresh_schema(services.dsn))
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup,
                   extra=("--processes", "2", *SLOW), env=SLOW_ENV)
    _wait_all_running(w, group, schema)
    recs, source = generated(topic, count=4000, partitions=6)
    produce(services.kafka_bootstrap, recs)
    return w, topic, group, schema, source


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=[s.name for s in GROUP_SETUPS])
def test_a_sigkilled_member_is_restarted_and_the_set_drains_exactly_once(
        services, setup: GroupSetup) -> None:
    w, topic, group, schema, source = _slow_set(services, setup)
    try:
        wait_until(lambda: committed_total(services.dsn, schema, group, topic) >= 400,
                   timeout_s=60, what="400 records committed")
        victim = _members(w)[1][0]
        os.kill(victim, signal.SIGKILL)  # batches of it are in flight: 4 at a time, 0.2 s each
        wait_until(lambda: len(_members(w).get(1, ())) == 2, timeout_s=60,
                   what="member 1 restarted")
        assert f"member 1 (pid {victim}) killed by signal 9: restart 1" in w.log()
        total = committed_total(services.dsn, schema, group, topic)
        assert total < len(source), "drained before the kill: nothing was tested"
        wait_until(lambda: committed_total(services.dsn, schema, group, topic) >= len(source),
                   timeout_s=180, what="the backlog committed after the restart")
        assert asyncio.run(exactly_once_problems(services.dsn, schema, group, topic,
                                                 source)) == []
        assert _stop(w) == 0, w.log()[-3000:]
        assert not any(_alive(p) for pids in _members(w).values() for p in pids)
    finally:
        w.ensure_dead()


def test_sigterm_mid_backlog_drains_every_member_and_exits_0(services) -> None:
    w, topic, group, schema, source = _slow_set(services, SETUP)
    try:
        wait_until(lambda: committed_total(services.dsn, schema, group, topic) >= 400,
                   timeout_s=60, what="400 records committed")
        assert _stop(w) == 0, w.log()[-3000:]
        stopped_at = committed_total(services.dsn, schema, group, topic)
        assert stopped_at < len(source), "drained before the stop: nothing was tested"
        log = w.log()
        assert "stopping the set (stop requested): SIGTERM to 2 member(s)" in log
        assert all(f"member {i} (pid {pids[0]}) exited 0" in log
                   for i, pids in _members(w).items()), log[-3000:]
        # what committed is exactly the prefix below the frontiers; a new set finishes it
        assert asyncio.run(exactly_once_problems(services.dsn, schema, group, topic, source,
                                                 require_complete=False)) == []
    finally:
        w.ensure_dead()
    again = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP,
                       extra=("--processes", "2"), name="again")
    try:
        wait_until(lambda: committed_total(services.dsn, schema, group, topic) >= len(source),
                   timeout_s=120, what="the rest committed")
        assert asyncio.run(exactly_once_problems(services.dsn, schema, group, topic,
                                                 source)) == []
        assert _stop(again) == 0
    finally:
        again.ensure_dead()


def test_a_member_exiting_with_a_non_restartable_code_ends_the_set_with_it(services) -> None:
    topic, group = unique("procs"), unique("gprocs")
    create_topic(services.kafka_bootstrap, topic, 6)
    schema = asyncio.run(fresh_schema(services.dsn))
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP,
                   extra=("--processes", "2", "--handler", f"{HANDLERS}:bad_member_handler"),
                   env={"FENCE_TEST_BAD_MEMBER": "1"})
    try:
        pids = _wait_all_running(w, group, schema)
        recs, _source = generated(topic, count=600, partitions=6)
        produce(services.kafka_bootstrap, recs)  # member 1's first batch ends it
        code = w.wait(120)
    finally:
        w.ensure_dead()
    log = w.log()
    assert code == 2, log[-3000:]  # the undefined table: configuration (SQLSTATE 42P01)
    assert _members(w) == pids, log[-3000:]  # nothing restarted
    assert f"member 1 (pid {pids[1][0]}) exited 2" in log
    assert "stopping the set (member 1 exited 2): SIGTERM to 1 member(s)" in log
    assert f"member 0 (pid {pids[0][0]}) exited 0" in log  # drained on the set's SIGTERM
    assert ": restart " not in log
