"""``fencectl topic``: create, list and describe Kafka topics (the local stack does not
create topics on first use).

  fencectl topic create NAME --partitions N [--replication R] [--if-not-exists]
  fencectl topic list [--all] [--json]
  fencectl topic describe NAME [--json]

Rules
- A name Kafka refuses is refused before anything is sent, with Kafka's own rule
  (``org.apache.kafka.common.internals.Topic.validate``: 1..249 characters of
  ``[a-zA-Z0-9._-]``, not ``.`` or ``..``); any other refusal is Kafka's, passed on.
- ``create`` returns once the broker reports every partition with a leader (Kafka's
  ``createTopics`` succeeds before metadata shows the topic), so a worker or producer
  started right after finds it. ``--replication`` defaults to the broker's
  ``default.replication.factor``.
- An existing topic is an error (exit 1), unless ``--if-not-exists`` and it has at least
  ``--partitions`` partitions (exit 0, nothing changed).
- librdkafka's own log lines stay off stderr unless ``--log-level debug``.
- Exit codes: ``EXITS`` (0 done; 1 Kafka refused or failed: topic exists, not found, too few
  brokers for the replication; 2 bad usage: a name Kafka refuses, ``--partitions`` < 1,
  Kafka not configured or unreachable).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

from consumer.exits import Exit
from consumer.kafka.adapter import checked_client_properties
from fencing.errors import ConfigError
from ops.librdkafka_logs import add_log_level_argument, client_log_settings

__all__ = ["EXITS", "TopicInfo", "register", "topic_name_problem"]

DONE = Exit(0, "done (`create --if-not-exists`: the topic exists with enough partitions, "
            "unchanged)", "nothing")
REFUSED = Exit(1, "Kafka refused or failed: the topic exists (`create`) or does not "
               "(`describe`), too few brokers for the replication, no leader after the wait",
               "read Kafka's reason on stderr; `fencectl topic list` shows what exists")
USAGE = Exit(2, "a name Kafka refuses, `--partitions` or `--replication` below 1, Kafka not "
             "configured (`KAFKA_BOOTSTRAP_SERVERS`, `FENCE_KAFKA_CONFIG`) or unreachable",
             "fix what the line on stderr names")
EXITS = (DONE, REFUSED, USAGE)

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
NAME_MAX = 249  # Kafka's Topic.MAX_NAME_LENGTH
_READY_TIMEOUT_S = 30.0


def topic_name_problem(name: str) -> str | None:
    """Pure: why Kafka refuses ``name`` as a topic name, or None when it accepts it."""
    if not name:
        return "a topic name must not be empty"
    if name in (".", ".."):
        return f"{name!r} is not allowed as a topic name"
    if len(name) > NAME_MAX:
        return f"a topic name has at most {NAME_MAX} characters (this one has {len(name)})"
    if not _LEGAL.match(name):
        bad = "".join(sorted({c for c in name if not _LEGAL.match(c)}))
        return (f"{name!r} holds characters Kafka does not allow ({bad!r}); use ASCII "
                "letters, digits, '.', '_' and '-'")
    return None


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    replication: int
    topic_id: str | None = None
    leaders: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.name, "partitions": self.partitions,
                "replication": self.replication, "topic_id": self.topic_id,
                "leaders": list(self.leaders)}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    p = sub.add_parser("topic", help="create, list and describe Kafka topics")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a topic (waits until it is usable)")
    create.add_argument("name", metavar="NAME", help="the topic's name")
    create.add_argument("--partitions", type=int, required=True, help="number of partitions")
    create.add_argument("--replication", type=int, default=None,
                        help="replication factor (default: the broker's "
                             "default.replication.factor)")
    create.add_argument("--if-not-exists", action="store_true",
                        help="succeed without change when it exists with enough partitions")
    listing = actions.add_parser("list", help="list topics and their partition counts")
    listing.add_argument("--all", action="store_true", help="also Kafka's internal __ topics")
    describe = actions.add_parser("describe", help="partitions, replication and topic id")
    describe.add_argument("name", metavar="NAME", help="the topic's name")
    for a in (create, listing, describe):
        a.add_argument("--bootstrap-servers", default=None,
                       help="Kafka bootstrap servers (default $KAFKA_BOOTSTRAP_SERVERS)")
        a.add_argument("--timeout-s", type=float, default=10.0,
                       help="bound of each Kafka request, seconds (default 10)")
        if a is not create:
            a.add_argument("--json", action="store_true", help="machine-readable output")
        add_log_level_argument(a)
        a.set_defaults(func=_main, exits=EXITS)


class _Refused(Exception):
    """Kafka refused or failed the request (``REFUSED``)."""


class _Usage(Exception):
    """Bad usage or no usable Kafka (``USAGE``)."""


def _admin(args: argparse.Namespace) -> Any:
    from confluent_kafka.admin import AdminClient

    bootstrap = args.bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
    if not bootstrap:
        raise _Usage("KAFKA_BOOTSTRAP_SERVERS is not set and no --bootstrap-servers given")
    try:
        props = checked_client_properties(os.environ)
    except ConfigError as exc:
        raise _Usage(str(exc)) from None
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "fencectl-topic",
                         **props, **client_log_settings(args.log_level)})
    where = "--bootstrap-servers" if args.bootstrap_servers else "KAFKA_BOOTSTRAP_SERVERS"
    try:
        admin.list_topics(timeout=args.timeout_s)
    except Exception as exc:
        raise _Usage(f"{where} {bootstrap}: cannot reach Kafka ({_kafka_text(exc)}); check "
                     "the host and port") from None
    return admin


def _kafka_text(exc: BaseException) -> str:
    err: Any = exc.args[0] if exc.args else None
    return str(err.str()) if hasattr(err, "str") else str(exc)


def _info(admin: Any, name: str, timeout_s: float) -> TopicInfo | None:
    meta = admin.list_topics(topic=name, timeout=timeout_s).topics.get(name)
    if meta is None or meta.error is not None or not meta.partitions:
        return None
    parts = [meta.partitions[p] for p in sorted(meta.partitions)]
    return TopicInfo(name, len(parts), max((len(p.replicas) for p in parts), default=0),
                     leaders=tuple(p.leader for p in parts))


def _ready(admin: Any, name: str, partitions: int, timeout_s: float) -> TopicInfo | None:
    """The topic once every partition has a leader (or what Kafka shows at the deadline)."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while True:
        info = _info(admin, name, timeout_s)
        if info is not None and info.partitions >= partitions and min(info.leaders) >= 0:
            return info
        if time.monotonic() >= deadline:
            return info
        time.sleep(0.1)


def _create(admin: Any, args: argparse.Namespace) -> int:
    from confluent_kafka.admin import NewTopic

    problem = topic_name_problem(args.name)
    if problem is not None:
        raise _Usage(f"topic create {args.name}: {problem}")
    if args.partitions < 1:
        raise _Usage(f"--partitions {args.partitions}: use 1 or more")
    if args.replication is not None and args.replication < 1:
        raise _Usage(f"--replication {args.replication}: use 1 or more")
    existing = _info(admin, args.name, args.timeout_s)
    if existing is not None:
        if args.if_not_exists and existing.partitions >= args.partitions:
            print(f"topic {args.name} exists: {existing.partitions} partition(s), "
                  f"replication {existing.replication} (unchanged)")
            return DONE.code
        raise _Refused(f"topic {args.name} already exists with {existing.partitions} "
                       "partition(s)")
    new = NewTopic(args.name, num_partitions=args.partitions,
                   replication_factor=-1 if args.replication is None else args.replication)
    try:
        admin.create_topics([new], request_timeout=args.timeout_s)[args.name].result(
            timeout=args.timeout_s + 5)
    except Exception as exc:
        raise _Refused(f"Kafka refused topic {args.name}: {_kafka_text(exc)}") from None
    info = _ready(admin, args.name, args.partitions, args.timeout_s)
    if info is None or min(info.leaders, default=-1) < 0:
        raise _Refused(f"topic {args.name} was created but its partitions have no leader "
                       f"after {_READY_TIMEOUT_S:g} s")
    print(f"created topic {args.name}: {info.partitions} partition(s), replication "
          f"{info.replication}")
    return DONE.code


def _describe(admin: Any, args: argparse.Namespace) -> int:
    from confluent_kafka import TopicCollection

    info = _info(admin, args.name, args.timeout_s)
    if info is None:
        raise _Refused(f"topic {args.name} does not exist")
    try:
        desc = admin.describe_topics(TopicCollection([args.name]),
                                     request_timeout=args.timeout_s)[args.name].result(
            timeout=args.timeout_s + 1)
        tid = getattr(desc, "topic_id", None)
        info = TopicInfo(info.name, info.partitions, info.replication,
                         None if tid is None else str(tid), info.leaders)
    except Exception as exc:  # the id is a detail: the rest was answered
        print(f"fencectl topic: describe_topics failed ({_kafka_text(exc)}): no topic id",
              file=sys.stderr)
    if args.json:
        print(json.dumps(info.as_dict(), indent=2))
    else:
        print(f"topic {info.name}: {info.partitions} partition(s), replication "
              f"{info.replication}, id {info.topic_id or '-'}")
        for p, leader in enumerate(info.leaders):
            print(f"  partition {p}: leader {leader}")
    return DONE.code


def _list(admin: Any, args: argparse.Namespace) -> int:
    topics = admin.list_topics(timeout=args.timeout_s).topics
    rows = sorted((name, len(t.partitions)) for name, t in topics.items()
                  if args.all or not name.startswith("__"))
    if args.json:
        print(json.dumps([{"topic": n, "partitions": c} for n, c in rows], indent=2))
    else:
        for name, count in rows:
            print(f"{name}  {count} partition(s)")
        print(f"{len(rows)} topic(s)")
    return DONE.code


def _main(args: argparse.Namespace) -> int:
    try:
        admin = _admin(args)
        return {"create": _create, "list": _list, "describe": _describe}[args.action](
            admin, args)
    except _Usage as exc:
        print(f"fencectl topic: {exc}", file=sys.stderr)
        return USAGE.code
    except _Refused as exc:
        print(f"fencectl topic: {exc}", file=sys.stderr)
        return REFUSED.code
