"""Zombie and shutdown behaviour of real worker processes, per group setup.

Zombie: member A holds an in-flight batch (the test handler blocks inside the store's
transaction), is SIGSTOPped, PostgreSQL ends its idle transaction (releasing the row lock),
the group hands its partitions to B and B advances them; after SIGCONT, A's batch cannot
commit (its handler is past its time limit; A's next write is fenced), A applies nothing,
and the effect tables equal the oracle's fold.

Shutdown: SIGTERM while batches are in flight ends with exit 0 within the bound and every
batch either committed or not applied; a batch still held past the bound is reported and
the exit code is 6.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    WorkerProc,
    committed_total,
    create_topic,
    durable_rows,
    exactly_once_problems,
    fresh_schema,
    generated,
    journal_rows,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

HOLDING = ("--handler", "tests.integration.handlers:holding_handler")


def _held(hold_dir: Path) -> list[Path]:
    return sorted(hold_dir.glob("held-*"))


# How A's row lock is released while A is stopped, and what A's held batch does on SIGCONT:
# "idle-timeout": PostgreSQL ends A's idle transaction after 2 s; A's handler is past its
#   time limit (90 % of it) on SIGCONT and is stopped: A's next write is fenced, or A drops
#   the batch without writing when the loss notice came first;
# "claim-ends-session": a long idle timeout (100 s, a 200 s budget: a handler call may last
#   90 s); B's claim ends A's session after 5 s; on SIGCONT A's handler returns, its COMMIT
#   finds the session gone, and the retry under its old token is fenced: exit 3.
MODES = {"idle-timeout": ("--db-idle-in-transaction-timeout-s", "2", "--call-budget-s", "120"),
         "claim-ends-session": ("--db-idle-in-transaction-timeout-s", "100",
                                "--call-budget-s", "200")}


@pytest.mark.parametrize("setup, mode", [
    *((s, "idle-timeout") for s in GROUP_SETUPS), (GROUP_SETUPS[1], "claim-ends-session")],
    ids=lambda v: v.name if isinstance(v, GroupSetup) else v)
def test_zombie_is_fenced_and_applies_nothing(services, setup: GroupSetup, mode: str,
                                               tmp_path: Path) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("zombie"), unique("gzombie")
    create_topic(bootstrap, topic, 2)
    recs, source = generated(topic, count=2_000, partitions=2, klass="conflict", seed=5)
    produce(bootstrap, recs)
    schema = asyncio.run(fresh_schema(dsn))
    (tmp_path / "hold").write_text("hold")
    # A's call budget outlives the stop (B first drains A's partitions' suspect windows: A
    # never released them), so what ends A after SIGCONT is the fence, not its budget
    a = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name="zombie",
                   extra=(*HOLDING, *MODES[mode]), env={"FENCE_TEST_HOLD_DIR": str(tmp_path)})
    b: WorkerProc | None = None
    try:
        wait_until(lambda: len(_held(tmp_path)) == 2, timeout_s=30,
                   what="A holding a batch of each partition")
        held = {int(p.read_text().split()[0]): p.read_text() for p in _held(tmp_path)}
        a.signal(signal.SIGSTOP)
        epochs_a = {p: e for p, (e, _f) in asyncio.run(
            durable_rows(dsn, schema, group, topic)).items()}
        assert all(f == 0 for _e, f in asyncio.run(
            durable_rows(dsn, schema, group, topic)).values())
        b = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name="owner")
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= len(source),
            timeout_s=90, what="B advancing every partition past A's held batches")
        rows = asyncio.run(durable_rows(dsn, schema, group, topic))
        assert all(rows[p][0] > epochs_a[p] for p in rows), (rows, epochs_a)
        (tmp_path / "hold").unlink()
        a.signal(signal.SIGCONT)
        try:
            code: int | None = a.wait(30)
        except Exception:
            code = None
        log = a.log()
        # Resumed, A finds its held batch past the handler's time limit (90 % of the 2 s
        # idle-in-transaction timeout): the handler is stopped, nothing of it commits
        # (TooSlow) and the batch is split. A's next write is fenced and it retires (exit 3);
        # or the loss notice came first and A drops the batch without another write, as for
        # any partition closed during failure handling, and stays a healthy member.
        if code is None:
            assert mode == "idle-timeout", (code, log[-3000:])
            assert "lost {" in log or "revoke {" in log, log[-3000:]
            a.terminate()
            assert a.wait(30) == 0, a.log()[-3000:]
        else:
            assert code == 3, (code, log[-3000:])
            assert "Fenced" in log
        b.terminate()
        assert b.wait(30) == 0, b.log()[-3000:]
    finally:
        a.ensure_dead()
        if b is not None:
            b.ensure_dead()
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []
    journal = asyncio.run(journal_rows(dsn, schema, group, topic))
    assert {j["partition"] for j in journal if j["event"] == "claim"} == {0, 1}
    # the batches A held are durable now, under B's newer epoch (A was fenced: exit 3), and
    # applied once (the oracle check above)
    final = asyncio.run(durable_rows(dsn, schema, group, topic))
    assert sorted(held) == [0, 1]
    for p, text in held.items():
        _p, first, last = (int(x) for x in text.split())
        assert first < last < final[p][1] and final[p][0] > epochs_a[p], (p, text, final)


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_sigterm_exits_0_within_bound(services, setup: GroupSetup) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("term"), unique("gterm")
    create_topic(bootstrap, topic, 4)
    recs, source = generated(topic, count=30_000, partitions=4, klass="conflict", seed=3)
    produce(bootstrap, recs)
    schema = asyncio.run(fresh_schema(dsn))
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name="term",
                   extra=("--batch-max-records", "100", "--shutdown-timeout-s", "10"))
    try:
        wait_until(lambda: committed_total(dsn, schema, group, topic) > 2_000,
                   timeout_s=30, what="processing under way")
        t0 = time.monotonic()
        w.terminate()
        assert w.wait(15) == 0, w.log()[-3000:]
        assert time.monotonic() - t0 < 12
    finally:
        w.ensure_dead()
    # Whatever committed is a prefix per partition: effects == fold of the committed prefix.
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source,
                                             require_complete=False)) == []
    events = [j["event"] for j in asyncio.run(journal_rows(dsn, schema, group, topic))]
    assert events.count("release") == 4, events  # the revoke at close released every partition


def test_shutdown_past_bound_reports_in_flight(services, tmp_path: Path) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("bound"), unique("gbound")
    create_topic(bootstrap, topic, 1)
    recs, source = generated(topic, count=500, partitions=1, seed=9)
    produce(bootstrap, recs)
    schema = asyncio.run(fresh_schema(dsn))
    (tmp_path / "hold").write_text("hold")
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=GROUP_SETUPS[1], name="bound",
                   extra=(*HOLDING, "--shutdown-timeout-s", "1"),
                   env={"FENCE_TEST_HOLD_DIR": str(tmp_path)})
    try:
        wait_until(lambda: _held(tmp_path), timeout_s=30, what="a held batch")
        w.terminate()
        assert w.wait(30) == 6
    finally:
        w.ensure_dead()
    assert "still in flight: " + f"{topic}[0] offsets 0.." in w.log()
    rows = asyncio.run(durable_rows(dsn, schema, group, topic))
    assert rows[0][1] == 0  # the held batch was not applied
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source,
                                             require_complete=False)) == []
