"""``fencectl quarantine relay``: publish a group's quarantined records to a dead-letter topic.

  fencectl quarantine relay --group G --topic DLQ [--source-topic T] [--follow]
      [--interval-s S] [--batch N] [--delivery-timeout-s S] [--bootstrap-servers B]
      [-X KEY=VALUE ...] [--json]

Rules
- Rows, records and headers: ``ops.operator.relay``. The producer is idempotent
  (``enable.idempotence``, acks=all); a flush of up to ``--batch`` records is awaited, and
  only the rows the broker acknowledged are then marked relayed, in one statement. A row
  whose delivery failed stays unmarked: it is published again by the next pass (one-shot:
  the next run), with the same ``fenceworker.dlq.id``.
- One-shot (default): relay until no row is left, then exit. ``--follow``: keep relaying,
  looking for new rows every ``--interval-s``, until SIGTERM or SIGINT (exit 0 once the
  pass in flight is marked); a delivery failure then waits for the next pass instead of
  ending the run.
- One relay per group at a time (``relay_lock``); the dead-letter topic must exist (it is
  never created here: its partitions and retention are the operator's to choose).
- Exit codes: ``EXITS`` (0 done; 1 a delivery failed (one-shot) or the database failed; 2
  bad usage or configuration: ``FENCE_DSN``/``KAFKA_BOOTSTRAP_SERVERS`` unset or refused,
  unknown ``--group``, missing topic, another relay of the group running).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException, Producer

from consumer.config import parse_x_options, redact
from consumer.exits import Exit
from consumer.kafka.adapter import checked_client_properties
from fencing.crashpoints import crash_point
from fencing.errors import ConfigError, SchemaMismatch
from ops.hints import schema_advice
from ops.librdkafka_logs import client_log_settings
from ops.operator.db import connection, require_known_group, tool_dsn_from_env
from ops.operator.relay import DeadLetter, Delivered, dead_letter, mark, pending, relay_lock

__all__ = ["EXITS", "add_parser"]

DONE = Exit(0, "done: no row left to relay (one-shot); `--follow` stopped by SIGTERM/SIGINT "
            "once the pass in flight was marked", "nothing")
FAILED = Exit(1, "a delivery failed (one-shot; its row stays unmarked), or the database failed",
              "run it again: a row not marked is published again, with the same "
              "`fenceworker.dlq.id`; read the reason on stderr if it persists", restart=True)
CONFIG = Exit(2, "`FENCE_DSN` or `KAFKA_BOOTSTRAP_SERVERS` unset or refused; schema not "
              "migrated; an unknown `--group`; the dead-letter topic missing (never created "
              "here); another relay of the group running; `--batch`, `--interval-s` or "
              "`--delivery-timeout-s` not positive", "fix what the line on stderr names")
EXITS = (DONE, FAILED, CONFIG)


def add_parser(actions: Any, *, schema_default: str) -> None:
    a = actions.add_parser("relay", help="publish quarantined records to a dead-letter topic, "
                                         "each row marked once the broker acknowledged it")
    a.add_argument("--group", required=True, help="consumer group")
    a.add_argument("--topic", required=True, metavar="DLQ", help="the dead-letter topic")
    a.add_argument("--source-topic", default=None,
                   help="only records quarantined from this topic")
    a.add_argument("--follow", action="store_true",
                   help="keep relaying new rows until SIGTERM/SIGINT")
    a.add_argument("--interval-s", type=float, default=1.0,
                   help="with --follow: how often to look for new rows (default 1)")
    a.add_argument("--batch", type=int, default=500,
                   help="records per flush (default 500)")
    a.add_argument("--delivery-timeout-s", type=float, default=60.0,
                   help="how long a flush waits for the broker (default 60)")
    a.add_argument("--bootstrap-servers", default=None,
                   help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)")
    a.add_argument("-X", dest="x", action="append", default=[], metavar="KEY=VALUE",
                   help="librdkafka producer property (repeatable)")
    a.add_argument("--json", action="store_true", help="machine-readable summary")
    a.add_argument("--schema", default=schema_default,
                   help="fence schema (default: $FENCE_SCHEMA or fence)")
    a.set_defaults(func=main, exits=EXITS)


def _producer(args: argparse.Namespace, bootstrap: str) -> Producer:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
        "message.timeout.ms": int(args.delivery_timeout_s * 1000), "linger.ms": 5,
        **client_log_settings(None)}
    conf.update(checked_client_properties(os.environ))
    conf.update(parse_x_options(args.x, flag="-X"))
    try:
        producer = Producer(conf)
        meta = producer.list_topics(args.topic, timeout=10)
    except KafkaException as exc:
        raise ConfigError(f"KAFKA_BOOTSTRAP_SERVERS {bootstrap}: {exc}") from None
    info = meta.topics.get(args.topic)
    if info is None or info.error is not None:
        raise ConfigError(f"--topic {args.topic}: the dead-letter topic does not exist "
                          f"(create it: fencectl topic create {args.topic} --partitions 1)")
    return producer


def _publish(producer: Producer, topic: str, letters: Sequence[DeadLetter],
             timeout_s: float) -> tuple[list[Delivered], list[str]]:
    """Produce ``letters`` and wait for their acknowledgements (blocking: a thread)."""
    delivered: list[Delivered] = []
    failed: list[str] = []

    def report(letter: DeadLetter) -> Any:
        def done(err: Any, msg: Any) -> None:
            if err is not None:
                failed.append(f"{letter.dedupe_id}: {err}")
            else:
                delivered.append(Delivered(letter, msg.topic(), msg.partition(), msg.offset()))
        return done

    for letter in letters:
        while True:
            try:
                producer.produce(topic, letter.value, letter.key, headers=list(letter.headers),
                                 timestamp=letter.timestamp_ms or 0,
                                 on_delivery=report(letter))
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(timeout_s)
    if left:
        failed.append(f"{left} record(s) not acknowledged within {timeout_s:g} s")
    return delivered, failed


async def _run(dsn: str, args: argparse.Namespace, bootstrap: str,
               stop: threading.Event) -> int:
    relayed, failures = 0, 0
    async with connection(dsn, schema=args.schema) as conn:
        await require_known_group(conn, schema=args.schema, group=args.group)
        if not await relay_lock(conn, args.group):
            raise ConfigError(f"--group {args.group}: another quarantine relay of this group "
                              "is running")
        producer = _producer(args, bootstrap)
        while not stop.is_set():
            rows = await pending(conn, args.schema, group=args.group,
                                 topic=args.source_topic, limit=args.batch)
            if rows:
                letters = [dead_letter(r) for r in rows]
                delivered, failed = await asyncio.to_thread(
                    _publish, producer, args.topic, letters, args.delivery_timeout_s)
                crash_point("relay-after-ack", delivered=len(delivered))
                relayed += await mark(conn, args.schema, delivered)
                if failed:
                    failures += len(failed)
                    print(f"fencectl quarantine relay: {len(failed)} not delivered (left "
                          f"unmarked, relayed again by the next pass): {failed[0]}",
                          file=sys.stderr, flush=True)
                    if not args.follow:
                        break
                if not args.json:
                    print(f"relayed {len(delivered)} record(s) to {args.topic}", flush=True)
                if len(rows) == args.batch and not failed:
                    continue
            if not args.follow:
                break
            await asyncio.to_thread(stop.wait, args.interval_s)
    if args.json:
        print(json.dumps({"relayed": relayed, "failed": failures, "topic": args.topic}))
    else:
        print(f"relay: {relayed} row(s) of group {args.group} relayed to {args.topic}"
              + (f", {failures} delivery failure(s)" if failures else ""))
    return (FAILED if failures and not args.follow else DONE).code


def main(args: argparse.Namespace) -> int:
    dsn = tool_dsn_from_env("fencectl quarantine relay")
    if dsn is None:
        return CONFIG.code
    bootstrap = args.bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
    if not bootstrap:
        print("fencectl quarantine relay: KAFKA_BOOTSTRAP_SERVERS is not set and no "
              "--bootstrap-servers given", file=sys.stderr)
        return CONFIG.code
    if args.batch < 1 or args.interval_s <= 0 or args.delivery_timeout_s <= 0:
        print("fencectl quarantine relay: --batch, --interval-s and --delivery-timeout-s "
              "must be positive", file=sys.stderr)
        return CONFIG.code
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        return asyncio.run(_run(dsn, args, bootstrap, stop))
    except ConfigError as exc:
        print(f"fencectl quarantine relay: {redact(str(exc), dsn=dsn)}", file=sys.stderr)
        return CONFIG.code
    except SchemaMismatch as exc:
        print(f"fencectl quarantine relay: {schema_advice(exc, args.schema)}", file=sys.stderr)
        return CONFIG.code
    except Exception as exc:  # the database failed: rows not marked are relayed again
        print(f"fencectl quarantine relay: {type(exc).__name__}: {redact(str(exc), dsn=dsn)}",
              file=sys.stderr)
        return FAILED.code
