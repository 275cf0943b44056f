"""``fencectl quarantine list|show|replay|purge`` against real PostgreSQL.

Records are quarantined by the real store (``PgFenceStore.process`` with a rejecting
handler); the commands run as ``fencectl`` subprocesses. The replay handler
(``tests.integration.quarantine_handlers``) writes into a table without a key, so a record
applied twice shows as two rows.

- list/show/replay/purge: a replay applies accepted records once and marks them replayed
  (who, when, result) with one ``replay`` journal row each; a record rejected again or whose
  handler raises stays quarantined with its original reason, the new one in
  ``replay_result``, and leaves no effect; running the
  same replay again applies nothing twice; ``purge --before`` deletes only handled rows and
  says how many.
- A replay SIGKILLed inside a record's transaction (its effect written, not committed), then
  re-run, applies every record exactly once.
- A role with only ``grant_operator_sql`` (plus INSERT on the handler's table) can list,
  replay and purge, and cannot touch the partition rows.
- A replay whose COMMIT reply is lost (the proxy cuts the connection after the server
  committed) stops with exit 1 saying so; re-running it applies nothing twice.
- End to end with a real worker and the reference handler: what the worker quarantined
  (records from Kafka) is listed, and replayed through the group's recorded handler (the
  reference handler its worker ran, read from its member row): each record is
  either applied (one outbox row, marked replayed) or stays quarantined with ``replays`` 1
  (the reference handler rejects stale revisions again); a second replay applies nothing
  again; a fixed handler then applies them, given the record's bytes as Kafka held them.
- A replayed record the worker quarantines again (its frontier was moved back) is
  ``quarantined`` again.
- Migration 0004 extends the journal's event CHECK from what the catalog holds: events an
  earlier migration added (as 0003 may) are kept.
- Two replays of the same records at once: each record is applied by exactly one of them
  (the other skips it: row lock ``SKIP LOCKED`` plus the state check).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from fencing.postgres.schema import load_migrations
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.testing.pgproxy import Action, PgProxy
from fencing.types import ClaimRequest, TopicPartition
from ops.operator.quarantine import grant_operator_sql
from tests.integration.observability_support import run_fencectl
from tests.integration.pg_helpers import effect_handler, make_records
from tests.integration.workers import (
    GROUP_SETUPS,
    ROOT,
    create_topic,
    fresh_schema,
    generated,
    produce,
    run_until_committed,
    unique,
)
from tests.polling import wait_until

pytestmark = pytest.mark.integration

HANDLER = "tests.integration.quarantine_handlers:effects_handler"
TOPIC = "orders"
TP = TopicPartition(TOPIC, 0)
BAD = (1, 2, 3, 4)


@pytest.fixture
async def quarantined(pg_dsn: str, fence_schema: str) -> AsyncIterator[tuple[str, str]]:
    """(schema, group) with offsets 0..5 processed; 1..4 quarantined (values ``bad-N``)."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    store = await PgFenceStore.connect(pg_dsn, group_id=group, schema=fence_schema)
    try:
        token = (await store.claim([ClaimRequest(TP, 0)], lifetime="lt-q"))[TP]
        await store.process(BatchCall(TP, make_records(TP, range(6), bad=BAD),
                                      effect_handler(fence_schema)), token)
    finally:
        await store.close()
    yield fence_schema, group


def _fencectl(schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_fencectl("quarantine", *args, "--schema", schema)


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.stdout, done.stderr
    return json.loads(done.stdout)


async def _fetch(dsn: str, sql: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def _effects(dsn: str, schema: str) -> dict[int, int]:
    rows = await _fetch(dsn, f'SELECT "offset", count(*) AS n FROM "{schema}".effects'
                             " GROUP BY 1")
    return {r["offset"]: r["n"] for r in rows}


async def _states(dsn: str, schema: str) -> dict[int, tuple[str, int, str]]:
    rows = await _fetch(dsn, f'SELECT "offset", state, replays, reason FROM "{schema}".quarantine')
    return {r["offset"]: (r["state"], r["replays"], r["reason"]) for r in rows}


async def _journal(dsn: str, schema: str, event: str) -> list[Any]:
    return await _fetch(dsn, f'SELECT lifetime, detail FROM "{schema}".journal WHERE event = $1'
                             " ORDER BY id", event)


async def test_list_show_replay_fail_again_and_purge(
        pg_dsn: str, quarantined: tuple[str, str]) -> None:
    schema, group = quarantined
    listed = _json(_fencectl(schema, "list", "--group", group, "--json"))
    assert [(r["offset"], r["state"], r["reason"]) for r in listed] == [
        (o, "quarantined", "value starts with bad") for o in BAD]

    shown = _json(_fencectl(schema, "show", "--group", group, "--topic", TOPIC,
                            "--partition", "0", "--offset", "2", "--json"))
    assert shown["value"] == {"text": "bad-2", "base64": None}
    assert shown["key"]["text"] == "k2"
    assert shown["headers"] == [{"key": "h", "base64": "dg=="}]  # b"v"
    missing = _fencectl(schema, "show", "--group", group, "--topic", TOPIC, "--partition", "0",
                        "--offset", "0")
    assert missing.returncode == 1 and "no quarantine row" in missing.stderr
    typo = _fencectl(schema, "replay", "--group", group + "x", "--handler", HANDLER)
    assert typo.returncode == 2 and f"--group {group}x: unknown group" in typo.stderr

    replay = ("replay", "--group", group, "--handler", HANDLER, "--handler-setting",
              "reject=bad-3", "--handler-setting", "raise=bad-4", "--json")
    first = _fencectl(schema, *replay)
    assert first.returncode == 1, first.stderr  # two records failed again
    report = _json(first)
    assert (report["applied"], report["failed"], report["skipped"]) == (2, 2, 0)
    assert await _effects(pg_dsn, schema) == {0: 1, 5: 1, 1: 1, 2: 1}  # nothing of 3 and 4
    states = await _states(pg_dsn, schema)
    assert states[1][:2] == states[2][:2] == ("replayed", 1)
    # failed again: the worker's reason stays, the replay's is beside it
    assert states[3] == states[4] == ("quarantined", 1, "value starts with bad")
    failed = await _fetch(pg_dsn, f'SELECT "offset", replay_result FROM "{schema}".quarantine'
                                  ' WHERE "offset" IN (3, 4) ORDER BY 1')
    assert failed[0]["replay_result"] == "still bad: bad-3"
    assert "ValueError: handler refuses bad-4" in failed[1]["replay_result"]
    who = await _fetch(pg_dsn, f'SELECT replayed_by, replayed_at, replay_result FROM "{schema}"'
                               '.quarantine WHERE "offset" = 1')
    assert who[0]["replayed_by"].startswith("operator:") and who[0]["replayed_at"] is not None
    assert who[0]["replay_result"] == "accepted"
    # status counts what is still quarantined (3 and 4), not the replayed rows
    status = run_fencectl("status", "--schema", schema, "--group", group, "--json")
    assert [p["quarantined"] for p in _json(status)["partitions"]] == [2], status.stdout

    second = _json(_fencectl(schema, *replay))  # the same replay again: nothing twice
    assert (second["applied"], second["failed"]) == (0, 2)
    assert await _effects(pg_dsn, schema) == {0: 1, 5: 1, 1: 1, 2: 1}
    assert (await _states(pg_dsn, schema))[3][1] == 2

    fixed = _fencectl(schema, "replay", "--group", group, "--handler", HANDLER)
    assert fixed.returncode == 0, fixed.stderr
    assert "replay: 2 applied, 0 failed again" in fixed.stdout
    assert await _effects(pg_dsn, schema) == {o: 1 for o in range(6)}
    journal = await _journal(pg_dsn, schema, "replay")
    assert len(journal) == 2 + 2 + 2 + 2  # one per record per run that reached it
    assert all(j["lifetime"].startswith("operator:") for j in journal)

    none = _fencectl(schema, "purge", "--group", group, "--before", "2000-01-01T00:00:00Z")
    assert none.returncode == 0 and "purged 0 " in none.stdout
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    purged = _json(_fencectl(schema, "purge", "--group", group, "--before", later, "--json"))
    assert purged == {"purged": 4, "partitions": [{"topic": TOPIC, "partition": 0,
                                                   "purged": 4}]}
    assert await _states(pg_dsn, schema) == {}
    assert len(await _journal(pg_dsn, schema, "purge")) == 1


async def test_purge_keeps_quarantined_rows(pg_dsn: str, quarantined: tuple[str, str]) -> None:
    schema, group = quarantined
    assert _fencectl(schema, "replay", "--group", group, "--handler", HANDLER, "--topic",
                     TOPIC, "--partition", "0", "--offset", "1").returncode == 0
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert "purged 1 " in _fencectl(schema, "purge", "--group", group, "--before",
                                    later).stdout
    assert sorted(await _states(pg_dsn, schema)) == [2, 3, 4]


def _popen_replay(schema: str, group: str, hold_dir: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, FENCE_TEST_HOLD_DIR=str(hold_dir))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "quarantine", "replay", "--group", group,
         "--handler", HANDLER, "--handler-setting", "hold_at=3", "--schema", schema,
         "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


async def test_replay_killed_mid_record_and_rerun_applies_once(
        pg_dsn: str, quarantined: tuple[str, str], tmp_path: Path) -> None:
    schema, group = quarantined
    (tmp_path / "hold").write_text("")
    proc = _popen_replay(schema, group, tmp_path)
    try:
        await asyncio.to_thread(wait_until, lambda: list(tmp_path.glob("held-*")),
                                timeout_s=60, what="the replay to hold inside offset 3")
        # 1 and 2 committed; 3's effect is written inside the open transaction
        assert await _effects(pg_dsn, schema) == {0: 1, 5: 1, 1: 1, 2: 1}
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    (tmp_path / "hold").unlink()

    async def open_transaction_gone() -> bool:  # the server rolls back the killed session
        rows = await _fetch(pg_dsn, "SELECT 1 FROM pg_stat_activity WHERE state = 'idle in"
                                    " transaction' AND query LIKE $1", f'%"{schema}".effects%')
        return not rows

    for _ in range(150):
        if await open_transaction_gone():
            break
        await asyncio.sleep(0.1)
    assert await open_transaction_gone()
    rerun = _fencectl(schema, "replay", "--group", group, "--handler", HANDLER, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert [(r["offset"], r["outcome"]) for r in _json(rerun)["results"]] == [
        (3, "applied"), (4, "applied")]
    assert await _effects(pg_dsn, schema) == {o: 1 for o in range(6)}
    assert {o: s[0] for o, s in (await _states(pg_dsn, schema)).items()} == {
        o: "replayed" for o in BAD}
    assert [j["detail"].split()[0] for j in await _journal(pg_dsn, schema, "replay")] == [
        "offset=1", "offset=2", "offset=3", "offset=4"]


async def test_concurrent_replays_apply_each_record_once(
        pg_dsn: str, quarantined: tuple[str, str], tmp_path: Path) -> None:
    schema, group = quarantined
    (tmp_path / "hold").write_text("")
    held = _popen_replay(schema, group, tmp_path)  # holds offset 3's row lock
    try:
        await asyncio.to_thread(wait_until, lambda: list(tmp_path.glob("held-*")),
                                timeout_s=60, what="the first replay to hold offset 3")
        other = _fencectl(schema, "replay", "--group", group, "--handler", HANDLER, "--json")
        assert other.returncode == 0, other.stderr
        assert [(r["offset"], r["outcome"]) for r in _json(other)["results"]] == [
            (3, "skipped"), (4, "applied")]
        (tmp_path / "hold").unlink()
        out, err = held.communicate(timeout=60)
    finally:
        if held.poll() is None:
            held.kill()
            held.communicate()
    assert held.returncode == 0, err
    assert [(r["offset"], r["outcome"]) for r in json.loads(out)["results"]] == [
        (1, "applied"), (2, "applied"), (3, "applied"), (4, "skipped")]
    assert await _effects(pg_dsn, schema) == {o: 1 for o in range(6)}


async def test_operator_role_with_documented_grants(pg_dsn: str,
                                                    quarantined: tuple[str, str]) -> None:
    schema, group = quarantined
    role, password = f"fence_op_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = await asyncpg.connect(pg_dsn)
    if not await admin.fetchval(
            "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"):
        await admin.close()
        pytest.skip("the FENCE_DSN user may not CREATE ROLE (give it CREATEROLE to run this)")
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        for stmt in grant_operator_sql(schema, role):
            await admin.execute(stmt)
        await admin.execute(f'GRANT INSERT ON "{schema}".effects TO {role}')  # the handler's
        parts = urlsplit(pg_dsn)
        env = {"FENCE_DSN": urlunsplit((parts.scheme, f"{role}:{password}@"
                                        f"{parts.netloc.rpartition('@')[2]}", parts.path,
                                        parts.query, ""))}

        def as_operator(*args: str) -> subprocess.CompletedProcess[str]:
            return run_fencectl("quarantine", *args, "--schema", schema, env=env)

        assert len(_json(as_operator("list", "--group", group, "--json"))) == 4
        replayed = as_operator("replay", "--group", group, "--handler", HANDLER)
        assert replayed.returncode == 0, replayed.stderr
        later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        assert "purged 4 " in as_operator("purge", "--group", group, "--before", later).stdout
        assert password not in replayed.stdout + replayed.stderr
        operator = await asyncpg.connect(env["FENCE_DSN"])
        try:
            for sql in (f'UPDATE "{schema}".partitions SET frontier = 0',
                        f'DELETE FROM "{schema}".journal'):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await operator.execute(sql)
        finally:
            await operator.close()
    finally:
        await admin.execute(f'REVOKE ALL ON ALL TABLES IN SCHEMA "{schema}" FROM {role}')
        await admin.execute(f'REVOKE ALL ON SCHEMA "{schema}" FROM {role}')
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def test_lost_commit_reply_then_rerun_applies_once(pg_dsn: str,
                                                        quarantined: tuple[str, str]) -> None:
    schema, group = quarantined
    parts = urlsplit(pg_dsn)
    async with PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        rule = proxy.add_rule("COMMIT", Action.CUT_AFTER)
        cut = await asyncio.to_thread(
            run_fencectl, "quarantine", "replay", "--group", group, "--handler", HANDLER,
            "--schema", schema, env={"FENCE_DSN": proxy.dsn(pg_dsn)})
        assert rule.fired.is_set()
    assert cut.returncode == 3  # outcome unknown
    assert f"replay stopped at {group} {TOPIC}[0]@1 after 0 record(s)" in cut.stderr
    assert "its outcome is unknown" in cut.stderr
    assert "re-run the same replay" in cut.stderr and "Traceback" not in cut.stderr
    assert await _effects(pg_dsn, schema) == {0: 1, 5: 1, 1: 1}  # the server had committed
    rerun = _fencectl(schema, "replay", "--group", group, "--handler", HANDLER, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert [r["offset"] for r in _json(rerun)["results"]] == [2, 3, 4]
    assert await _effects(pg_dsn, schema) == {o: 1 for o in range(6)}


async def test_worker_quarantine_replayed_through_the_default_handler(pg_dsn: str,
                                                                      services: Any) -> None:
    topic, group = unique("q-e2e"), unique("g-q-e2e")
    await asyncio.to_thread(create_topic, services.kafka_bootstrap, topic, 1)
    recs, _source = generated(topic, count=80, partitions=1, klass="conflict")
    await asyncio.to_thread(produce, services.kafka_bootstrap, recs)
    schema = await fresh_schema(pg_dsn)
    await asyncio.to_thread(run_until_committed, topic=topic, group=group, schema=schema,
                            dsn=pg_dsn, setup=GROUP_SETUPS[0], total=80)
    quarantined = _json(_fencectl(schema, "list", "--group", group, "--json"))
    assert len(quarantined) == len(await _states(pg_dsn, schema)) > 0
    outbox_sql = f'SELECT src_offset, count(*) AS n FROM "{schema}".ref_outbox GROUP BY 1'
    before = {r["src_offset"]: r["n"] for r in await _fetch(pg_dsn, outbox_sql)}
    assert not set(before) & {q["offset"] for q in quarantined}

    first = _fencectl(schema, "replay", "--group", group, "--json")  # the group's handler
    report = _json(first)
    assert report["handler"]["spec"] == "ops.reference.pg:reference"
    assert report["handler"]["source"].startswith("recorded by the group's last member lt-")
    assert report["applied"] + report["failed"] == len(quarantined) and report["skipped"] == 0
    assert first.returncode == (1 if report["failed"] else 0), first.stderr
    after = {r["src_offset"]: r["n"] for r in await _fetch(pg_dsn, outbox_sql)}
    applied = {r["offset"] for r in report["results"] if r["outcome"] == "applied"}
    assert {o: n for o, n in after.items() if o not in before} == {o: 1 for o in applied}
    states = await _states(pg_dsn, schema)
    for o, (state, replays, _reason) in states.items():
        assert (state, replays) == (("replayed", 1) if o in applied else ("quarantined", 1))

    again = _json(_fencectl(schema, "replay", "--group", group, "--json"))
    assert again["applied"] == 0 and again["failed"] == report["failed"]
    assert {r["src_offset"]: r["n"] for r in await _fetch(pg_dsn, outbox_sql)} == after

    # a fixed handler applies them: the record reaches it with Kafka's bytes
    await _fetch(pg_dsn, f'CREATE TABLE "{schema}".effects (topic text, partition int,'
                         ' "offset" bigint, value bytea)')
    fixed = _json(_fencectl(schema, "replay", "--group", group, "--handler", HANDLER,
                            "--limit", "5", "--json"))
    assert fixed["applied"] == min(5, again["failed"])
    rows = await _fetch(pg_dsn, f'SELECT "offset", value FROM "{schema}".effects')
    assert {r["offset"]: r["value"] for r in rows} == {
        r["offset"]: recs[r["offset"]].value for r in fixed["results"]}


async def test_migration_0004_keeps_journal_events_added_before_it(pg_dsn: str) -> None:
    schema = f"fence_t_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        async with conn.transaction():
            await conn.execute(f'SET LOCAL search_path TO "{schema}"')
            for mig in load_migrations():
                if mig.version == 4:  # as if 0003 had added an event of its own
                    await conn.execute(
                        "ALTER TABLE journal DROP CONSTRAINT journal_event_check;"
                        " ALTER TABLE journal ADD CONSTRAINT journal_event_check CHECK (event"
                        " IN ('claim', 'fence', 'retire', 'release', 'gap-skip', 'reset',"
                        " 'adopt', 'poison'))")
                await conn.execute(mig.sql)
        for event in ("claim", "poison", "replay", "purge"):
            await conn.execute(f'INSERT INTO "{schema}".journal (group_id, topic, partition,'
                               " event) VALUES ('g', 't', 0, $1)", event)
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(f'INSERT INTO "{schema}".journal (group_id, topic, partition,'
                               " event) VALUES ('g', 't', 0, 'nonsense')")
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


async def test_requarantined_after_a_frontier_reset_is_quarantined_again(
        pg_dsn: str, quarantined: tuple[str, str]) -> None:
    schema, group = quarantined
    assert _fencectl(schema, "replay", "--group", group, "--handler", HANDLER).returncode == 0
    assert {s[0] for s in (await _states(pg_dsn, schema)).values()} == {"replayed"}
    await _fetch(pg_dsn, f'UPDATE "{schema}".partitions SET frontier = 2 WHERE group_id = $1',
                 group)  # what `fencectl reset frontier --to-offset 2` does to the row
    store = await PgFenceStore.connect(pg_dsn, group_id=group, schema=schema)
    try:
        token = (await store.claim([ClaimRequest(TP, 0)], lifetime="lt-q2"))[TP]
        await store.process(BatchCall(TP, make_records(TP, range(2, 6), bad=BAD),
                                      effect_handler(schema)), token)
    finally:
        await store.close()
    states = await _states(pg_dsn, schema)
    assert {o: s[0] for o, s in states.items()} == {1: "replayed", 2: "quarantined",
                                                    3: "quarantined", 4: "quarantined"}
