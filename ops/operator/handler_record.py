"""Which handler a group runs, as its members record it, for ``fencectl quarantine replay``.

Rules
- ``fencectl run`` records its handler in every member row it writes
  (``detail.handler``): ``{"spec": "module:name", "settings": {...}, "redacted": [...]}``.
  ``--sink table=T --sink-key K`` is recorded as what it is sugar for (the sink's factory
  and its settings). A setting whose name looks secret (password, secret, token,
  credential, dsn, api key, private) or whose value holds a URL password is left out and
  its name listed under ``redacted``: member rows are read by operators. The table sink's
  ``registry`` (the schema registry's URL, which may carry credentials) is never recorded:
  it comes from ``SCHEMA_REGISTRY_URL`` in the environment of the command that builds the
  sink (``with_registry``), and only for a format that needs the registry; so is its
  ``ddl_dsn`` (``FENCE_DDL_DSN``, ``--sink-evolve add-columns`` only). Rows also carry
  the handler's declaration (``durability``, ``effects``, ``on_failure``).
- ``choose`` (pure) picks the group's handler from its member rows: the handler of its
  live members (observed now, neither stopped nor retired), which must agree; with none
  live, that of the member seen last. Rows without a record (older workers) are ignored.
  No record, or live members that disagree (a rolling deploy), is a ``ConfigError`` that
  says what to pass instead (``--handler`` or ``--sink``).
- ``--handler-setting`` given with the recorded handler overrides or adds settings (the
  way to give back a redacted one); a redacted setting not given back is refused.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fencing.errors import ConfigError
from fencing.postgres import sink as sink_module
from fencing.postgres.schema import quote_schema
from fencing.postgres.sink.keys import Format
from ops.operator.member_view import FINAL_STATES, Availability, MemberRow, classify_member

__all__ = [
    "SINK_FLAGS",
    "SINK_HANDLER",
    "HandlerChoice",
    "choose",
    "handler_from_flags",
    "read_member_rows",
    "record_of",
    "with_registry",
]

#: ``--sink table=NAME [--sink-key COL]``, spelled from the imported factory
SINK_HANDLER = f"{sink_module.__name__}:{sink_module.table_sink.__name__}"
_SECRET_NAME = re.compile(r"pass|secret|token|credential|dsn|api[-_.]?key|private", re.I)
_URL_PASSWORD = re.compile(r"://[^/@\s:]*:[^@\s]+@")
#: the sink's formats that decode through the schema registry (``sink.keys.Format.registry``)
_REGISTRY_FORMATS = frozenset(f.value for f in Format if f.registry)
_FROM_ENV = ("registry", "ddl_dsn")  # the sink's settings from the environment, never recorded


@dataclass(frozen=True, slots=True)
class HandlerChoice:
    """A handler to build: ``spec`` (module:name) and its factory settings; ``source`` says
    where it came from (printed before a replay)."""

    spec: str
    settings: Mapping[str, str] = field(default_factory=dict)
    source: str = "given"
    redacted: tuple[str, ...] = ()

    def describe(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(self.settings.items()))
        return f"{self.spec}" + (f" ({shown})" if shown else "")


def record_of(spec: str, settings: Mapping[str, str]) -> dict[str, Any]:
    """What a member row records of its handler (see the module Rules)."""
    settings = {k: v for k, v in settings.items() if not (spec == SINK_HANDLER
                                                          and k in _FROM_ENV)}
    kept = {k: v for k, v in settings.items()
            if not _SECRET_NAME.search(k) and not _URL_PASSWORD.search(v)}
    return {"spec": spec, "settings": kept,
            "redacted": sorted(k for k in settings if k not in kept)}


def with_registry(choice: HandlerChoice, registry: str, ddl_dsn: str = "") -> HandlerChoice:
    """``choice`` with the schema registry's URL (``SCHEMA_REGISTRY_URL``) added when it is
    the table sink with a format that needs the registry, and ``ddl_dsn``
    (``FENCE_DDL_DSN``) when it is the sink with ``evolve=add-columns``; unchanged
    otherwise."""
    if choice.spec != SINK_HANDLER:
        return choice
    if ddl_dsn.strip() and choice.settings.get("evolve") == "add-columns" and (
            "ddl_dsn" not in choice.settings):
        choice = dataclasses.replace(choice, settings={**choice.settings,
                                                       "ddl_dsn": ddl_dsn.strip()})
    if not registry.strip() or "registry" in choice.settings:
        return choice
    formats = (choice.settings.get("format"), choice.settings.get("key_format"))
    if not any(f in _REGISTRY_FORMATS for f in formats):
        return choice
    return dataclasses.replace(choice, settings={**choice.settings,
                                                 "registry": registry.strip()})


#: the sink's flags beside ``--sink``: (argparse attribute, flag, the factory's setting)
SINK_FLAGS = (("sink_key", "--sink-key", "key"), ("sink_format", "--sink-format", "format"),
              ("sink_key_format", "--sink-key-format", "key_format"),
              ("sink_evolve", "--sink-evolve", "evolve"),
              ("sink_envelope", "--sink-envelope", "envelope"),
              ("sink_truncate", "--sink-truncate", "truncate"),
              ("sink_version_column", "--sink-version-column", "version"),
              ("sink_version_from", "--sink-version-from", "version_from"))


def handler_from_flags(*, handler: str | None, settings: Mapping[str, str],
                       sink: str | None, sink_options: Mapping[str, str | None] | None = None,
                       registry: str = "", ddl_dsn: str = "") -> HandlerChoice | None:
    """The handler ``--handler``/``--handler-setting`` or ``--sink`` with its
    ``sink_options`` (``SINK_FLAGS``' attributes -> values: ``--sink-key``,
    ``--sink-format``, ``--sink-key-format``) name; ``registry`` (``SCHEMA_REGISTRY_URL``)
    becomes the sink's ``registry`` setting. None when neither ``--handler`` nor ``--sink``
    is given; ``ddl_dsn`` (``FENCE_DDL_DSN``) becomes its ``ddl_dsn`` with
    ``--sink-evolve add-columns``. Raises ``ConfigError``, naming the sink's mistakes before
    anything starts."""
    options: dict[str, str] = {attr: value for attr, value in (sink_options or {}).items()
                               if value is not None}
    if sink is None:
        for attr, flag, _setting in SINK_FLAGS:
            if attr in options:
                raise ConfigError(f"{flag} {options[attr]}: needs --sink table=NAME")
        return None if handler is None else HandlerChoice(handler, dict(settings))
    kind, sep, name = sink.partition("=")
    if kind.strip() != "table" or not sep or not name.strip():
        raise ConfigError(f"--sink {sink}: expected table=NAME (or table=SCHEMA.NAME)")
    if handler is not None:
        raise ConfigError(f"--sink {sink} --handler {handler}: the sink is the handler; give "
                          "one of them")
    if settings:
        raise ConfigError("--handler-setting: not for --sink (use --sink-key)")
    chosen = {"table": name.strip()}
    for attr, _flag, setting in SINK_FLAGS:
        if attr in options:
            chosen[setting] = options[attr].strip()
    choice = with_registry(HandlerChoice(SINK_HANDLER, chosen), registry, ddl_dsn)
    sink_module.SinkSpec.from_settings(choice.settings)
    return choice


async def read_member_rows(conn: Any, *, schema: str, group: str
                           ) -> tuple[datetime, list[MemberRow]]:
    """The database clock and every member row of ``group``."""
    q = quote_schema(schema)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        now = await conn.fetchval("SELECT now()")
        rows = await conn.fetch(
            f"SELECT lifetime_id, group_id, member_id, host, pid, state, started_at, last_seen,"
            f" detail::text AS detail FROM {q}.members WHERE group_id = $1", group)
    return now, [MemberRow(r["lifetime_id"], r["group_id"], r["member_id"], r["host"],
                           r["pid"], r["state"], r["started_at"], r["last_seen"],
                           json.loads(r["detail"])) for r in rows]


def _recorded(row: MemberRow) -> tuple[str, dict[str, str], tuple[str, ...]] | None:
    raw = row.detail.get("handler")
    if not isinstance(raw, Mapping) or not isinstance(raw.get("spec"), str):
        return None
    settings = raw.get("settings") if isinstance(raw.get("settings"), Mapping) else {}
    redacted = raw.get("redacted") if isinstance(raw.get("redacted"), list) else []
    return (raw["spec"], {str(k): str(v) for k, v in (settings or {}).items()},
            tuple(str(k) for k in redacted or ()))


def _show(spec: str, settings: Mapping[str, str]) -> str:
    return HandlerChoice(spec, settings).describe()


def choose(rows: Sequence[MemberRow], *, group: str, now: datetime,
           overrides: Mapping[str, str]) -> HandlerChoice:
    """Pure: the group's recorded handler (see the module Rules); ``overrides`` are the
    ``--handler-setting`` values given with it. Raises ``ConfigError``."""
    recorded = [(row, rec) for row in rows if (rec := _recorded(row)) is not None]
    if not recorded:
        raise ConfigError(f"--group {group}: no member recorded the handler it runs (members "
                          "of this version record it when they start); give --handler "
                          "module:name [--handler-setting K=V ...] or --sink table=NAME "
                          "[--sink-key COL], as the group was started with")
    live = [(row, rec) for row, rec in recorded
            if (view := classify_member(row, now=now)).availability is Availability.OBSERVED
            and view.state not in FINAL_STATES]
    if live:
        distinct = {json.dumps([rec[0], rec[1], rec[2]], sort_keys=True): (row, rec)
                    for row, rec in sorted(live, key=lambda x: x[0].lifetime_id)}
        if len(distinct) > 1:
            runs = "; ".join(f"{row.lifetime_id} runs {_show(rec[0], rec[1])}"
                             for row, rec in distinct.values())
            raise ConfigError(f"--group {group}: its live members run different handlers "
                              f"({runs}); give the one to replay with: --handler "
                              "module:name [--handler-setting K=V ...] or --sink table=NAME")
        row, (spec, settings, redacted) = live[0]
        source = f"recorded by the group's live member {row.lifetime_id}"
    else:
        row, (spec, settings, redacted) = max(recorded, key=lambda x: x[0].last_seen)
        source = (f"recorded by the group's last member {row.lifetime_id} (last seen "
                  f"{row.last_seen.isoformat()})")
    missing = [k for k in redacted if k not in overrides]
    if missing:
        raise ConfigError(f"--group {group}: the recorded handler {spec} has setting(s) "
                          f"{', '.join(missing)} that members do not record (they look "
                          "secret); give them with --handler-setting NAME=VALUE")
    return HandlerChoice(spec, {**settings, **overrides}, source, redacted)
