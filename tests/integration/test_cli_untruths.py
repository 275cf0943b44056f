"""What a user reads from the operator commands is true, checked on the output they print,
against real PostgreSQL, Kafka and Jaeger: the TOPICS table counts live owners only; trace
marks quarantined records and says when the asked record's link is past the cap; quarantine
list shows reasons whole; reset plans read naturally; the sink logs the table it created;
librdkafka's own lines stay off stderr; a subcommand's bad flag prints that subcommand's
usage; a closed pipe ends ``--json`` output quietly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Producer

from ops.operator.reset_plan import Action, operation_id
from tests.cli_output import one_line
from tests.integration.observability_support import (
    run_fencectl,
    start_worker,
    unique_service,
)
from tests.integration.workers import ROOT, create_topic, durable_rows, fresh_schema, unique
from tests.polling import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("go_services")]  # Jaeger

RECORDS = 300  # one batch (--batch-max-records 300): past the span's 128 producer links
BAD_VALUE = b'{"id": 1, "amount": 5 "currency": "EUR", "note": "no comma before currency"}'


@dataclass(frozen=True, slots=True)
class SinkRun:
    schema: str
    group: str
    big: str  # RECORDS reference records, one producer span each
    bad: str  # one value that is not JSON: quarantined alone
    table: str
    service: str
    log: str
    status_running: str
    status_stopped: str


def _status_topics(text: str) -> dict[str, tuple[int, int]]:
    """TOPICS table of ``fencectl status``: topic -> (PARTITIONS, OWNED)."""
    lines = text.split("\nTOPICS\n", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return {cells[1]: (int(cells[2]), int(cells[3])) for cells in (ln.split() for ln in lines)}


@pytest.fixture(scope="module")
def sink_run(services: Any) -> Iterator[SinkRun]:
    schema = asyncio.run(fresh_schema(services.dsn))
    group, big, bad = unique("g-true"), unique("big"), unique("bad")
    table, service = unique("true_sink"), unique_service("true")
    env = {"FENCE_SCHEMA": schema}
    for topic in (big, bad):
        create_topic(services.kafka_bootstrap, topic, 1)
    produced = run_fencectl("produce", "--topic", big, "--count", str(RECORDS), "--seed", "4",
                            "--class", "valid", "--partitions", "1", "--span-every", "1")
    assert produced.returncode == 0, produced.stderr
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap})
    producer.produce(bad, BAD_VALUE, b"k1")
    assert producer.flush(30) == 0
    worker = start_worker(topic=big, group=group, schema=schema, service=service,
                          extra=("--topic", bad, "--sink", f"table={table}",
                                                   "--batch-max-records", str(RECORDS)))
    try:
        def done() -> bool:
            rows = asyncio.run(durable_rows(services.dsn, schema, group, big))
            more = asyncio.run(durable_rows(services.dsn, schema, group, bad))
            return rows.get(0, (0, 0))[1] == RECORDS and more.get(0, (0, 0))[1] == 1
        wait_until(done, timeout_s=90, what="both topics committed")
        running = run_fencectl("status", "--group", group, env=env)
        assert running.returncode == 0, running.stderr
        worker.terminate()
        assert worker.wait(30) == 0, worker.log()[-3000:]
    finally:
        worker.ensure_dead()
    stopped = run_fencectl("status", "--group", group, env=env)
    assert stopped.returncode == 0, stopped.stderr
    yield SinkRun(schema, group, big, bad, table, service, worker.log(), running.stdout,
                  stopped.stdout)


def test_topics_table_counts_only_partitions_with_a_live_owner(sink_run: SinkRun) -> None:
    assert _status_topics(sink_run.status_running) == {sink_run.big: (1, 1),
                                                       sink_run.bad: (1, 1)}
    assert _status_topics(sink_run.status_stopped) == {sink_run.big: (1, 0),
                                                       sink_run.bad: (1, 0)}
    assert "observed/stopped" in sink_run.status_stopped


def test_the_sink_logs_the_table_it_created(sink_run: SinkRun) -> None:
    assert (f'table sink: created table "public"."{sink_run.table}" (payload jsonb, '
            in sink_run.log)


def test_quarantine_list_shows_the_reason_whole(sink_run: SinkRun) -> None:
    env = {"FENCE_SCHEMA": sink_run.schema, "COLUMNS": "60"}
    shown = run_fencectl("quarantine", "show", "--group", sink_run.group, "--topic",
                         sink_run.bad, "--partition", "0", "--offset", "0", "--json", env=env)
    reason = json.loads(shown.stdout)["reason"]
    assert len(reason) > 60 and "line 1 column 23" in reason, reason
    listed = run_fencectl("quarantine", "list", "--group", sink_run.group, env=env)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].startswith(f"{sink_run.group} {sink_run.bad}[0]@0 quarantined replays=0")
    wrapped = [ln for ln in lines[1:-1]]
    assert all(len(ln) <= 60 for ln in wrapped) and len(wrapped) > 1
    assert wrapped[0].startswith("    reason: ")
    assert " ".join(ln.strip() for ln in wrapped).removeprefix("reason: ") == reason
    wide = run_fencectl("quarantine", "list", "--group", sink_run.group, "--wide", env=env)
    assert wide.stdout.splitlines()[1] == f"    reason: {reason}"


def test_trace_marks_a_quarantined_record_and_a_link_past_the_cap(
        sink_run: SinkRun, services: Any) -> None:
    from tests.integration.observability_support import jaeger_spans

    jaeger_spans(services.jaeger_query_url, sink_run.service, operation="fence.process",
                 until=lambda ss: {s.tags.get("messaging.destination.name") for s in ss}
                 >= {sink_run.big, sink_run.bad})
    env = {"JAEGER_QUERY_URL": services.jaeger_query_url}
    common = ("--partition", "0", "--service", sink_run.service, "--lookback", "1h")
    bad = run_fencectl("trace", "--topic", sink_run.bad, "--offset", "0", *common, env=env)
    assert bad.returncode == 0, bad.stderr
    assert " outcome=ok quarantined=1 offsets=0..0 " in bad.stdout.splitlines()[0]
    (batch,) = json.loads(run_fencectl("trace", "--topic", sink_run.bad, "--offset", "0",
                                       *common, "--json", env=env).stdout)
    assert batch["quarantined"] == 1
    late = RECORDS - 1
    big = run_fencectl("trace", "--topic", sink_run.big, "--offset", str(late), *common,
                       env=env)
    assert big.returncode == 0, big.stderr
    head, note = big.stdout.splitlines()[:2]
    assert f"offsets=0..{late} " in head and "quarantined" not in head
    assert note == (f"note: offset {late} is record {RECORDS} of {RECORDS} of this batch; a "
                    "span keeps at most 128 producer links (OpenTelemetry's default), so its "
                    "producer span is not linked")
    early = run_fencectl("trace", "--topic", sink_run.big, "--offset", "5", *common, env=env)
    assert not early.stdout.splitlines()[1].startswith("note:")


def test_reset_plan_and_journal_read_naturally(sink_run: SinkRun) -> None:
    env = {"FENCE_SCHEMA": sink_run.schema}
    base = ("reset", "frontier", "--group", sink_run.group, "--topic", sink_run.big,
            "--partition", "0")
    plan = run_fencectl(*base, "--to-offset", "290", env=env)
    assert plan.returncode == 2, plan.stderr
    first = plan.stdout.splitlines()[0]
    assert first.startswith(f"{sink_run.big}[0]: frontier {RECORDS} -> 290: offsets "
                            f"290..{RECORDS - 1} are processed again; epoch 1 -> 2, fences "
                            "owner lt-"), first
    applied = run_fencectl(*base, "--to-offset", "290", "--reason", "re-run",
                           "--yes-i-understand", env=env)
    assert applied.returncode == 0, applied.stderr
    history = run_fencectl("status", "--history", "--group", sink_run.group, "--topic",
                           sink_run.big, "--partition", "0", "--json", env=env)
    last = json.loads(history.stdout)[-1]
    operation = operation_id(Action.FRONTIER, group=sink_run.group, topic=sink_run.big,
                             partition=0, to_offset=290)
    assert f"operation {operation}: applied and journaled" in applied.stdout
    assert (last["event"], last["detail"]) == (
        "reset", f"operation {operation}: frontier {RECORDS} -> 290: offsets "
                 f"290..{RECORDS - 1} are processed again; reason: re-run")
    status = run_fencectl("status", "--group", sink_run.group, env=env).stdout
    row = next(ln for ln in status.splitlines() if ln.startswith(f"{sink_run.group}  "
                                                                  f"{sink_run.big}  0 "))
    assert row.split()[-1] == "operator" and row.split()[-2].startswith("operator:")
    assert "reset by operator:" in status


def test_no_librdkafka_lines_on_stderr_unless_debug(sink_run: SinkRun, services: Any) -> None:
    # librdkafka logs each refused connection ("%3|...|FAIL|... Connect to ipv4#127.0.0.1:1
    # failed: Connection refused"); it picks a bootstrap broker at random, so nine dead ones
    # before the live one make it try one of them first almost always
    dead_first = ",".join([*(f"127.0.0.1:{port}" for port in range(1, 10)),
                           services.kafka_bootstrap])
    produce = ("produce", "--count", "5", "--seed", "1", "--class", "valid", "--partitions",
               "1", "--bootstrap-servers", dead_first)
    quiet = run_fencectl(*produce, "--topic", unique("quiet"))
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    loud = [run_fencectl(*produce, "--topic", unique("loud"), "--log-level", "debug")
            for _ in range(3)]
    assert all(done.returncode == 0 for done in loud)
    assert any("Connection refused" in done.stderr for done in loud), [d.stderr for d in loud]
    status = ("status", "--schema", sink_run.schema, "--bootstrap-servers", "127.0.0.1:1",
              "--kafka-timeout-s", "2")
    quiet_status = run_fencectl(*status)
    assert quiet_status.returncode == 0 and quiet_status.stderr == "", quiet_status.stderr
    assert "Kafka did not answer" in quiet_status.stdout  # the command says it, once
    loud_status = run_fencectl(*status, "--log-level", "debug")
    assert "Connect to ipv4#127.0.0.1:1 failed" in loud_status.stderr


def test_a_subcommand_bad_flag_prints_that_subcommands_usage() -> None:
    done = run_fencectl("quarantine", "list", "--wdie")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: fencectl quarantine list ")
    assert done.stderr.rstrip().endswith("fencectl quarantine list: error: unrecognized "
                                         "arguments: --wdie")
    other = run_fencectl("reset", "frontier", "--group", "g", "--topic", "t", "--partition",
                         "0", "--to-offset", "1", "--yes-please")
    assert other.stderr.startswith("usage: fencectl reset frontier ")


@pytest.mark.parametrize("argv", [
    ("status", "--json"), ("topic", "list", "--json"), ("quarantine", "list", "--json"),
    ("trace", "--topic", "t", "--partition", "0", "--offset", "0", "--json"),
])
def test_a_closed_pipe_ends_json_output_quietly(sink_run: SinkRun, services: Any,
                                                argv: tuple[str, ...]) -> None:
    """Like ``| head``: the reader has gone before the command writes."""
    read, write = os.pipe()
    os.close(read)
    env = dict(os.environ, PYTHONPATH=str(ROOT), FENCE_SCHEMA=sink_run.schema,
               JAEGER_QUERY_URL=services.jaeger_query_url)
    if argv[0] == "trace":
        argv = ("trace", "--topic", sink_run.big, "--partition", "0", "--offset", "3",
                "--service", sink_run.service, "--lookback", "1h", "--json")
    try:
        done = subprocess.run([sys.executable, "-m", "ops.cli", *argv], cwd=ROOT, env=env,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
                              check=False)
    finally:
        os.close(write)
    assert done.stderr == "" and done.returncode == 141, (done.returncode, done.stderr)


def test_pattern_refusal_echoes_the_pattern_as_typed() -> None:
    done = run_fencectl("run", "--topic-pattern", r"orders-\d+", "--group", "g")
    assert done.returncode == 2
    assert one_line(done).startswith(r"fencectl run: --topic-pattern 'orders-\d+': \d is not")
