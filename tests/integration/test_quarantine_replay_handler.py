"""``fencectl quarantine replay`` re-drives a record through the group's own handler, as its
members recorded it, against real PostgreSQL and Kafka and a real worker.

- A group run with ``--sink table=T --sink-key id``: the documented ``quarantine replay
  --group G --topic T --partition 0 --offset O`` replays through the sink (not the reference
  handler). A record still bad fails again (exit 1) and keeps the worker's precise reason,
  the replay's next to it (both shown by ``show``); a record that failed for a reason the
  operator fixed in the table is applied into the table.
- Live members that record different handlers, or none recorded, are refused (exit 2)
  saying what to pass; ``--sink`` overrides; a setting a member did not record (it looks
  secret) must be given with ``--handler-setting``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from confluent_kafka import Producer

from tests.cli_output import one_line
from tests.integration.observability_support import run_fencectl
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    create_topic,
    durable_rows,
    fresh_schema,
    run_until_committed,
    unique,
)
from tests.polling import wait_until

pytestmark = pytest.mark.integration

BAD_JSON = b'{"id": "2", "amount": 3 "note": "a comma is missing before note"}'
VALUES = [b'{"id": "1", "amount": 5}', BAD_JSON, b'{"id": "3"}', b'{"id": "4", "amount": 9}']


@dataclass(frozen=True, slots=True)
class SinkGroup:
    schema: str
    group: str
    topic: str
    table: str


async def _sql(dsn: str, sql: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _quarantine(schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_fencectl("quarantine", *args, env={"FENCE_SCHEMA": schema})


@pytest.fixture(scope="module")
def sink_group(services: Any) -> Iterator[SinkGroup]:
    """A real sink worker ran over VALUES: offset 1 (bad JSON) and 2 (no amount, which the
    table requires) are quarantined; 0 and 3 are rows."""
    dsn = services.dsn
    schema = asyncio.run(fresh_schema(dsn))
    topic, group, table = unique("orders"), unique("orders-sink"), unique("orders")
    asyncio.run(_sql(dsn, f'CREATE TABLE public."{table}" (id text PRIMARY KEY, amount int NOT'
                          " NULL)"))
    create_topic(services.kafka_bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap})
    for value in VALUES:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0
    run_until_committed(topic=topic, group=group, schema=schema, dsn=dsn,
                        setup=GROUP_SETUPS[0], total=len(VALUES),
                        extra=("--sink", f"table={table}", "--sink-key", "id"))
    assert asyncio.run(durable_rows(dsn, schema, group, topic))[0][1] == len(VALUES)
    yield SinkGroup(schema, group, topic, table)


def test_replay_uses_the_groups_sink_and_keeps_the_original_reason(
        sink_group: SinkGroup, services: Any) -> None:
    g = sink_group
    where = ("--group", g.group, "--topic", g.topic, "--partition", "0")
    before = json.loads(_quarantine(g.schema, "show", *where, "--offset", "1", "--json").stdout)
    original = before["reason"]
    assert "Expecting ',' delimiter: line 1 column 25" in original, original

    again = _quarantine(g.schema, "replay", *where, "--offset", "1")
    assert again.returncode == 1, again.stderr
    lines = again.stdout.splitlines()
    assert lines[0] == (f"replaying with fencing.postgres.sink:table_sink (key=id, table="
                        f"{g.table}) (recorded by the group's last member lt-"
                        + lines[0].split("lt-", 1)[1])
    assert "malformed" not in again.stdout  # the reference handler's words
    after = json.loads(_quarantine(g.schema, "show", *where, "--offset", "1", "--json").stdout)
    assert (after["state"], after["replays"], after["reason"]) == ("quarantined", 1, original)
    assert "Expecting ',' delimiter" in after["replay_result"]
    shown = _quarantine(g.schema, "show", *where, "--offset", "1").stdout
    assert f"reason: {original}" in shown and "replay_result: table sink:" in shown

    # offset 2 lacked a required column; the operator gives it a default, then replays it
    asyncio.run(_sql(services.dsn, f'ALTER TABLE public."{g.table}" ALTER amount SET '
                                   "DEFAULT 0"))
    fixed = _quarantine(g.schema, "replay", *where, "--offset", "2", "--json")
    assert fixed.returncode == 0, fixed.stderr
    report = json.loads(fixed.stdout)
    assert report["applied"] == 1 and report["handler"]["settings"] == {"table": g.table,
                                                                       "key": "id"}
    rows = asyncio.run(_sql(services.dsn, f'SELECT id, amount FROM public."{g.table}"'
                                          " ORDER BY id"))
    assert [(r["id"], r["amount"]) for r in rows] == [("1", 5), ("3", 0), ("4", 9)]


async def _member(dsn: str, schema: str, group: str, lifetime: str,
                  handler: dict[str, Any] | None, state: str = "running") -> None:
    detail: dict[str, Any] = {"heartbeat_interval_s": 5, "unavailable_after_s": 15}
    if handler is not None:
        detail["handler"] = handler
    await _sql(dsn, f'INSERT INTO "{schema}".members (lifetime_id, group_id, host, pid, state,'
                    " detail) VALUES ($1, $2, 'h', 1, $3, $4::jsonb)", lifetime, group, state,
               json.dumps(detail))


def test_members_that_disagree_or_record_nothing_are_refused(services: Any) -> None:
    dsn = services.dsn
    schema = asyncio.run(fresh_schema(dsn))
    group = unique("g")
    asyncio.run(_member(dsn, schema, group, "lt-old", None))
    none = _quarantine(schema, "replay", "--group", group)
    assert none.returncode == 2
    assert one_line(none).startswith(f"fencectl quarantine: --group {group}: no member "
                                     "recorded the handler it runs")
    sink = {"spec": "fencing.postgres.sink:table_sink", "settings": {"table": "a"},
            "redacted": []}
    asyncio.run(_member(dsn, schema, group, "lt-a", sink))
    asyncio.run(_member(dsn, schema, group, "lt-b", {**sink, "settings": {"table": "b"}}))
    split = _quarantine(schema, "replay", "--group", group)
    assert split.returncode == 2
    assert one_line(split) == (
        f"fencectl quarantine: --group {group}: its live members run different handlers "
        "(lt-a runs fencing.postgres.sink:table_sink (table=a); lt-b runs "
        "fencing.postgres.sink:table_sink (table=b)); give the one to replay with: --handler "
        "module:name [--handler-setting K=V ...] or --sink table=NAME")
    chosen = _quarantine(schema, "replay", "--group", group, "--sink", "table=a", "--json")
    assert chosen.returncode == 0, chosen.stderr
    assert json.loads(chosen.stdout)["handler"] == {
        "spec": "fencing.postgres.sink:table_sink", "settings": {"table": "a"},
        "source": "given"}


def test_a_secret_setting_is_not_recorded_and_must_be_given_back(services: Any) -> None:
    dsn = services.dsn
    schema = asyncio.run(fresh_schema(dsn))
    group = unique("g")
    recorded = {"spec": "tests.integration.quarantine_handlers:effects_handler",
                "settings": {"reject": "x"}, "redacted": ["api_token"]}
    asyncio.run(_member(dsn, schema, group, "lt-s", recorded))
    refused = _quarantine(schema, "replay", "--group", group)
    assert refused.returncode == 2
    assert "setting(s) api_token that members do not record (they look secret); give them " \
           "with --handler-setting NAME=VALUE" in one_line(refused)
    given = _quarantine(schema, "replay", "--group", group, "--handler-setting",
                        "api_token=t0k", "--json")
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout)["handler"]["settings"] == {"reject": "x",
                                                               "api_token": "t0k"}


def test_a_running_worker_records_its_handler_without_secrets(services: Any) -> None:
    dsn = services.dsn
    schema = asyncio.run(fresh_schema(dsn))
    topic, group = unique("rec"), unique("g-rec")
    create_topic(services.kafka_bootstrap, topic, 1)
    sql = f'SELECT detail::text AS d FROM "{schema}".members WHERE group_id = $1'
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=GROUP_SETUPS[0], extra=(
        "--handler", "tests.integration.quarantine_handlers:effects_handler",
        "--handler-setting", "reject=x", "--handler-setting", "db_password=hunter2"))
    try:
        wait_until(lambda: asyncio.run(_sql(dsn, sql, group)), timeout_s=60,
                   what="a member row")
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
    rows = asyncio.run(_sql(dsn, sql, group))
    assert rows and all("hunter2" not in r["d"] for r in rows)
    assert {json.dumps(json.loads(r["d"])["handler"], sort_keys=True) for r in rows} == {
        json.dumps({"spec": "tests.integration.quarantine_handlers:effects_handler",
                    "settings": {"reject": "x"}, "redacted": ["db_password"],
                    # and its declaration (the default: effects_handler declares none)
                    "durability": "durable-critical", "effects": "transactional",
                    "on_failure": "quarantine"},
                   sort_keys=True)}
