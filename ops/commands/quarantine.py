"""``fencectl quarantine``: inspect, replay and purge quarantined records.

  fencectl quarantine list   [--group G] [--topic T] [--partition P] [--state S] [--wide]
      [--json]
  fencectl quarantine show   --group G --topic T --partition P --offset O [--json]
  fencectl quarantine replay --group G [--topic T] [--partition P] [--offset O ...]
      [--handler module:name | --sink table=NAME [--sink-key COL] [--sink-format F]
      [--sink-key-format F] [--sink-evolve M]] [--handler-setting K=V ...] [--limit N] [--json]
  fencectl quarantine purge  --group G --before TIMESTAMP [--topic T] [--json]
  fencectl quarantine relay  --group G --topic DLQ [--follow] ...   (``ops.commands.relay``)

``replay`` re-drives the selected quarantined records through the group's own handler, as
its members recorded it (``ops.operator.handler_record``: the live members', which must
agree, else the last member's; ``--handler-setting`` adds or overrides settings), or
through ``--handler``/``--sink`` when given; each record in its own transaction that also
marks the row replayed and journals it (``ops.operator.quarantine``): re-running it, also
after a crash, applies nothing twice. Exit codes: 0 done (replay: every selected record
applied; show: found), 1 a replayed record failed again, a row was not found, or the
database failed before COMMIT (nothing of that record or purge applied), 2 bad usage or
configuration (``FENCE_DSN`` unset or refused, schema not migrated, unknown ``--group``, no
recorded handler or members that disagree and no ``--handler``/``--sink``, a bad
``FENCE_CRASH_AT``), 3 outcome unknown (a replay's or the purge's COMMIT was sent and its
reply lost or past ``--timeout-s``): re-run the same command, which applies nothing twice.
The table is ``EXITS``.

Long because list, show, replay and purge share their selection flags, the replay's
handler choice and the exit codes declared here.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from consumer.config import parse_x_options, redact
from consumer.exits import Exit
from fencing.errors import ConfigError, NotCommitted, OutcomeUnknown, SchemaMismatch
from fencing.handler import HandlerContext, build_handler
from fencing.postgres.schema import DEFAULT_SCHEMA, quote_schema
from ops.commands import relay
from ops.commands.reset import operator_identity
from ops.hints import schema_advice
from ops.operator.db import DEFAULT_TIMEOUT_S, connection, require_known_group, tool_dsn_from_env
from ops.operator.handler_record import (
    SINK_FLAGS,
    HandlerChoice,
    choose,
    handler_from_flags,
    read_member_rows,
    with_registry,
)
from ops.operator.quarantine import (
    Outcome,
    QuarantineKey,
    ReplayResult,
    Selection,
    State,
    purge,
    replay_one,
    select_rows,
)

__all__ = ["EXITS", "register", "row_dict"]

DONE = Exit(0, "done: `list` printed, `show` found the row, `replay` applied every selected "
            "record, `purge` deleted and journaled", "nothing")
FAILED = Exit(1, "a replayed record failed again (still quarantined), `show` found no such "
              "row, or the database failed before COMMIT (nothing of that record or purge "
              "applied)",
              "read the failure (`fencectl quarantine show`); fix the handler or the data, "
              "then replay again: nothing is applied twice")
CONFIG = Exit(2, "`FENCE_DSN` unset, refused or unreachable; schema not migrated; an unknown "
              "`--group`; a replay with no recorded handler, or members that disagree, and "
              "no `--handler`/`--sink`; a bad `FENCE_CRASH_AT`",
              "fix what the line on stderr names")
OUTCOME_UNKNOWN = Exit(3, "outcome unknown: a replay's or the purge's COMMIT was sent and its "
                       "reply lost or past `--timeout-s`",
                       "run the same command again: it applies nothing twice")
EXITS = (DONE, FAILED, CONFIG, OUTCOME_UNKNOWN)

_STATES = {"quarantined": State.QUARANTINED, "replayed": State.REPLAYED, "all": None}
_REASON_INDENT = "    reason: "
_WIDTH_DEFAULT = 100  # columns when stdout is not a terminal


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    p = sub.add_parser("quarantine", help="list, show, replay and purge quarantined records")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    helps = {"list": "list quarantine rows", "show": "show one quarantined record in full",
             "replay": "re-drive quarantined records through the handler, each exactly once",
             "purge": "delete replayed rows handled before --before"}
    for name, help_text in helps.items():
        a = actions.add_parser(name, help=help_text)
        a.add_argument("--group", required=name != "list", default=None, help="consumer group")
        a.add_argument("--topic", required=name == "show", default=None,
                       help="the source topic" if name == "show" else "only this source topic")
        if name != "purge":
            a.add_argument("--partition", type=int, required=name == "show", default=None,
                           help="the partition" if name == "show" else "only this partition")
        if name == "show":
            a.add_argument("--offset", type=int, required=True, help="the record's offset")
        if name == "replay":
            a.add_argument("--offset", type=int, action="append", default=[],
                           help="only this offset (repeatable; needs --topic and --partition)")
            a.add_argument("--handler", default=None,
                           help="handler or handler factory, module:name (default: the one "
                                "the group's members recorded)")
            a.add_argument("--sink", default=None, metavar="table=NAME",
                           help="the built-in table sink, as for run")
            a.add_argument("--sink-key", default=None, metavar="COLUMN[,COLUMN...]",
                           help="with --sink: its key columns, as for run")
            a.add_argument("--sink-format", default=None, metavar="FORMAT",
                           help="with --sink: how values are encoded, as for run")
            a.add_argument("--sink-key-format", default=None, metavar="FORMAT",
                           help="with --sink: how the Kafka key is encoded, as for run")
            a.add_argument("--sink-evolve", default=None, help="with --sink: as for run")
            a.add_argument("--sink-envelope", default=None, metavar="ENVELOPE",
                           help="with --sink: debezium reads values as Debezium change events, "
                                "as for run (default: none)")
            a.add_argument("--sink-truncate", action="store_const", const="true", default=None,
                           help="with --sink-envelope debezium: as for run (default: off)")
            a.add_argument("--sink-version-column", default=None, metavar="COL",
                           help="with --sink: the version guard, as for run (default: none)")
            a.add_argument("--sink-version-from", default=None, metavar="FROM",
                           help="with --sink-version-column: as for run (default: row)")
            a.add_argument("--handler-setting", action="append", default=[],
                           metavar="KEY=VALUE",
                           help="a setting for a handler factory (with the recorded handler: "
                                "added to or overriding its recorded settings)")
        if name in ("list", "replay"):
            a.add_argument("--limit", type=int, default=None, help="at most N records")
        if name == "list":
            a.add_argument("--state", choices=tuple(_STATES), default="quarantined",
                           help="quarantined (default: not yet replayed), replayed, or all")
            a.add_argument("--wide", action="store_true",
                           help="each reason on one line, not wrapped to the terminal")
        if name == "purge":
            a.add_argument("--before", required=True, type=_timestamp,
                           help="ISO 8601 time; rows replayed before it are deleted "
                                "(no time zone: UTC)")
        if name in ("replay", "purge"):
            a.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                           help="bound on each transaction in seconds (default 30; past it "
                                "after COMMIT was sent the outcome is unknown)")
        a.add_argument("--json", action="store_true", help="machine-readable output")
        a.add_argument("--schema", default=os.environ.get("FENCE_SCHEMA", DEFAULT_SCHEMA),
                       help="fence schema (default: $FENCE_SCHEMA or fence)")
        a.set_defaults(func=_main, quarantine_action=name, exits=EXITS)
    relay.add_parser(actions, schema_default=os.environ.get("FENCE_SCHEMA", DEFAULT_SCHEMA))


def _timestamp(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time (e.g. 2026-01-31T12:00:00Z)") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _bytes(value: bytes | None) -> dict[str, str | None]:
    if value is None:
        return {"text": None, "base64": None}
    try:
        return {"text": value.decode("utf-8"), "base64": None}
    except UnicodeDecodeError:
        return {"text": None, "base64": base64.b64encode(value).decode()}


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def row_dict(row: Any) -> dict[str, Any]:
    """A quarantine row as JSON-ready values (bytes as text, or base64 when not UTF-8)."""
    headers = json.loads(row["headers"]) if isinstance(row["headers"], str) else row["headers"]
    return {"group": row["group_id"], "topic": row["topic"], "partition": row["partition"],
            "offset": row["offset"], "state": row["state"], "reason": row["reason"],
            "epoch": row["epoch"], "quarantined_at": _iso(row["at"]),
            "replays": row["replays"], "replayed_by": row["replayed_by"],
            "replayed_at": _iso(row["replayed_at"]), "replay_result": row["replay_result"],
            "key": _bytes(row["key"]), "value": _bytes(row["value"]),
            "headers": [{"key": k, "base64": v} for k, v in headers or []]}


def _reason_lines(reason: str, *, wide: bool) -> list[str]:
    """The whole reason under its row: wrapped to the terminal's width, or one line."""
    if wide:
        return [_REASON_INDENT + reason]
    width = shutil.get_terminal_size((_WIDTH_DEFAULT, 24)).columns
    return textwrap.wrap(reason, width=max(40, width), initial_indent=_REASON_INDENT,
                         subsequent_indent=" " * len(_REASON_INDENT),
                         break_long_words=True, break_on_hyphens=False) or [_REASON_INDENT]


def _selection(args: argparse.Namespace) -> Selection:
    offsets = tuple(args.offset) if args.quarantine_action == "replay" else (
        (args.offset,) if args.quarantine_action == "show" else ())
    if args.quarantine_action == "replay" and offsets and (args.topic is None
                                                           or args.partition is None):
        raise ConfigError("--offset needs --topic and --partition")
    if getattr(args, "limit", None) is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1 (got {args.limit})")
    state = _STATES[args.state] if args.quarantine_action == "list" else (
        None if args.quarantine_action == "show" else State.QUARANTINED)
    return Selection(group_id=args.group, topic=args.topic,
                     partition=getattr(args, "partition", None), offsets=offsets, state=state,
                     limit=getattr(args, "limit", None))


class ReplayStopped(Exception):
    """The database failed during one record's transaction: before COMMIT (not applied) or
    with COMMIT in flight (outcome unknown); re-running is safe either way."""

    def __init__(self, key: QuarantineKey, done: int, cause: BaseException) -> None:
        self.unknown = not isinstance(cause, NotCommitted)
        state = ("its outcome is unknown (COMMIT was sent and its reply lost)" if self.unknown
                 else "it was not applied (COMMIT was never sent)")
        super().__init__(f"replay stopped at {key} after {done} record(s): "
                         f"{type(cause).__name__}: {cause}; {state}: re-run the same replay "
                         "(records already replayed are skipped, so none is applied twice)")


async def _handler_choice(conn: Any, args: argparse.Namespace) -> HandlerChoice:
    """``--handler``/``--sink`` when given, else the group's recorded handler."""
    settings = parse_x_options(args.handler_setting, flag="--handler-setting",
                               strip_values=False)
    urls = os.environ.get("SCHEMA_REGISTRY_URL", ""), os.environ.get("FENCE_DDL_DSN", "")
    options = {attr: getattr(args, attr, None) for attr, _flag, _setting in SINK_FLAGS}
    given = handler_from_flags(handler=args.handler, settings=settings, sink=args.sink,
                               sink_options=options, registry=urls[0], ddl_dsn=urls[1])
    if given is not None:
        return given
    now, members = await read_member_rows(conn, schema=args.schema, group=args.group)
    return with_registry(choose(members, group=args.group, now=now, overrides=settings), *urls)


async def _replay(conn: Any, args: argparse.Namespace,
                  rows: Sequence[Any]) -> tuple[HandlerChoice, list[ReplayResult]]:
    topics = tuple(sorted({r["topic"] for r in rows})) or ((args.topic,) if args.topic else ())
    choice = await _handler_choice(conn, args)
    if not args.json:
        print(f"replaying with {choice.describe()} ({choice.source})", flush=True)
    loaded = build_handler(choice.spec, HandlerContext(
        schema=args.schema, group_id=args.group, topics=topics,
        settings=dict(choice.settings)))
    if loaded.ensure_tables is not None:
        await loaded.ensure_tables(conn)
    operator = operator_identity()
    results: list[ReplayResult] = []
    for r in rows:
        key = QuarantineKey(r["group_id"], r["topic"], r["partition"], r["offset"])
        try:
            result = await replay_one(conn, args.schema, key, loaded.fn, operator=operator,
                                      timeout_s=args.timeout_s)
        except Exception as exc:
            raise ReplayStopped(key, len(results), exc) from exc
        results.append(result)
        if not args.json:
            print(f"{key}: {result.outcome.value}: {result.detail}", flush=True)
    return choice, results


async def _run(dsn: str, args: argparse.Namespace) -> int:
    sel = _selection(args) if args.quarantine_action != "purge" else None
    async with connection(dsn, schema=args.schema) as conn:
        if args.group is not None:  # a typo'd group is refused, not "0 rows"
            await require_known_group(conn, schema=args.schema, group=args.group)
        if args.quarantine_action == "purge":
            counts = await purge(conn, args.schema, group_id=args.group, before=args.before,
                                 topic=args.topic, operator=operator_identity(),
                                 timeout_s=args.timeout_s)
            total = sum(counts.values())
            if args.json:
                print(json.dumps({"purged": total, "partitions": [
                    {"topic": tp.topic, "partition": tp.partition, "purged": n}
                    for tp, n in counts.items()]}, indent=2))
            else:
                print(f"purged {total} replayed quarantine row(s) of group {args.group} "
                      f"handled before {args.before.isoformat()}")
            return DONE.code
        assert sel is not None
        rows = await select_rows(conn, args.schema, sel)
        if args.quarantine_action == "replay":
            choice, results = await _replay(conn, args, rows)
            return _report(choice, results, args.json)
        return _print_rows(rows, args)


def _print_rows(rows: Sequence[Any], args: argparse.Namespace) -> int:
    if args.quarantine_action == "show":
        if not rows:
            print(f"fencectl quarantine show: no quarantine row {args.group} "
                  f"{args.topic}[{args.partition}]@{args.offset}", file=sys.stderr)
            return FAILED.code
        shown = row_dict(rows[0])
        if args.json:
            print(json.dumps(shown, indent=2))
        else:
            for field, value in shown.items():
                shown_value = json.dumps(value) if isinstance(value, dict | list) else value
                print(f"{field:>15}: {shown_value}")
        return DONE.code
    if args.json:
        print(json.dumps([row_dict(r) for r in rows], indent=2))
        return DONE.code
    for r in rows:
        print(f"{r['group_id']} {r['topic']}[{r['partition']}]@{r['offset']} {r['state']} "
              f"replays={r['replays']} at={_iso(r['at'])}")
        print("\n".join(_reason_lines(r["reason"], wide=args.wide)))
    print(f"{len(rows)} row(s)")
    return DONE.code


def _report(choice: HandlerChoice, results: Sequence[ReplayResult], as_json: bool) -> int:
    counts = {o: sum(1 for r in results if r.outcome is o) for o in Outcome}
    if as_json:
        print(json.dumps({"handler": {"spec": choice.spec, "settings": dict(choice.settings),
                                      "source": choice.source},
                          "results": [r.as_dict() for r in results],
                          **{o.value: n for o, n in counts.items()}}, indent=2))
    else:
        print(f"replay: {counts[Outcome.APPLIED]} applied, {counts[Outcome.FAILED]} failed "
              f"again (still quarantined), {counts[Outcome.SKIPPED]} skipped")
    return (FAILED if counts[Outcome.FAILED] else DONE).code


def _main(args: argparse.Namespace) -> int:
    dsn = tool_dsn_from_env("fencectl quarantine")
    if dsn is None:
        return CONFIG.code
    try:
        quote_schema(args.schema)
        return asyncio.run(_run(dsn, args))
    except ConfigError as exc:
        print(f"fencectl quarantine: {redact(str(exc), dsn=dsn)}", file=sys.stderr)
        return CONFIG.code
    except SchemaMismatch as exc:
        print(f"fencectl quarantine: {schema_advice(exc, args.schema)}", file=sys.stderr)
        return CONFIG.code
    except ReplayStopped as exc:
        print(f"fencectl quarantine: {redact(str(exc), dsn=dsn)}", file=sys.stderr)
        return (OUTCOME_UNKNOWN if exc.unknown else FAILED).code
    except OutcomeUnknown as exc:  # purge
        print(f"fencectl quarantine: outcome unknown: {redact(str(exc), dsn=dsn)}: the purge "
              "may or may not have been applied; re-run it (rows already purged are gone, the "
              "rest is purged and journaled once)", file=sys.stderr)
        return OUTCOME_UNKNOWN.code
    except BrokenPipeError:
        raise  # the reader of stdout left: ops.cli ends quietly
    except Exception as exc:  # the database failed: report without the DSN; re-running is safe
        print(f"fencectl quarantine: {type(exc).__name__}: {redact(str(exc), dsn=dsn)}",
              file=sys.stderr)
        return FAILED.code
