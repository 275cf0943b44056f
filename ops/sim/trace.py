"""Trace format version 5 (``worker-schedule-v1``; versions 1 to 4 are still read): parse
strictly, dump canonically.

Long because the trace format's strict validation (unknown fields, provenance, choices)
is one reviewed unit.

Rules
- A trace is one JSON object with exactly the fields of ``Trace``; nested objects have
  exactly their documented fields. Unknown fields, trailing content, a different version
  or implementation, a different toolchain (Python major.minor, fenceworker version), a
  config digest that does not match the config, invalid choices and reuse of a lifetime
  id are rejected with ``TraceError`` naming the offending place (``steps[3].faults[0]``).
- Lifetimes: ``start`` declares worker N; a fault's ``interleave.replacement`` N reserves
  N (even if the fault is never reached). Every id is declared once; a step may refer
  only to a worker declared by an earlier step.
- Version 2 adds (and a version 1 trace may not use): a list of partitions for an assign
  or revoke step (one lifecycle call for the set); fault operations ``skip`` (assign's
  gap-skip) and ``journal`` (release and retire rows), and faults on revoke steps; an
  interleave ``revoke: true`` (process only: the calling lifetime revokes the step's
  partition while the batch is in flight); the config's ``topic_recreated_before_drain``
  (written only when true, so version 1 digests are unchanged). A trace is dumped with
  the version it was read with, so a version 1 trace round-trips byte for byte.
- Version 3 adds (and versions 1 and 2 may not use): a list of partitions for a process
  step (one batch per partition, all in flight at once in one lifetime); interleaves on
  validate and observe (``at: before`` only: a stop or takeover while the read is in
  flight, e.g. during a seek); the ``heartbeat`` actor (one member-heartbeat tick of a
  lifetime) with ``heartbeat`` faults; the ``expire`` actor (``partition``, ``offset``, no
  worker: Kafka's retention deletes the partition's records below ``offset``).
- Version 4 adds (and versions 1 to 3 may not use): the ``lost`` actor (``worker``,
  ``partition`` or a list: the group session is lost, the lifetime drops those tokens
  locally, no I/O); an interleave ``lost: true`` (a process step's process call only: the
  next batch of each of the step's partitions is delivered to the same lifetime and queues
  behind the partition's guard, then the assignment of the step's partitions is lost); a
  list of partitions for a seek step (one ``seek_all``: one observe for the set); the
  config's ``poison`` and ``transient`` records (written only when any: the handler-failure
  path, ``ops.sim.failures``) and the faults ``attempt`` (the attempt-count upsert; commit,
  abort, unknown-committed, unknown-aborted) on process steps and ``attempts`` (the failure
  marks read at a claim; commit, abort) on assign steps.
- Version 5 adds (and versions 1 to 4 may not use): the config's ``lanes`` (2 or more: key-
  ordered lanes, ``ops.sim.lanes``), ``lanes_window`` and ``fold_every`` (written only with
  lanes, so earlier digests are unchanged; a lanes config has no poison or transient
  records); the faults ``lane`` (one lane's transaction: commit, abort, unknown-committed,
  unknown-aborted; interleaves before and after, with ``revoke`` too) and ``fold`` (the
  fold transaction; the same outcomes, no interleave) on process steps. The generator
  writes version 5 only for a lanes config, so the traces of every other config are the
  version 4 traces they were.
- ``dumps`` is canonical (sorted keys, fixed separators, one trailing newline), so a
  parse/dump round trip is byte-identical.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from fencing.memory.faults import Fault, FaultOutcome, Interleave, Operation
from fencing.types import SourceRecord

__all__ = [
    "ACTORS",
    "IMPLEMENTATION",
    "VERSION",
    "SimConfig",
    "Step",
    "Trace",
    "TraceError",
    "config_digest",
    "dumps",
    "fault_json",
    "parse",
    "toolchain",
]

VERSION = 5
VERSIONS = (1, 2, 3, 4, 5)
IMPLEMENTATION = "worker-schedule-v1"
ACTORS = ("start", "assign", "seek", "process", "revoke", "stop", "heartbeat", "expire", "lost")
_V3_ACTORS = ("heartbeat", "expire")
_V4_ACTORS = ("lost",)
_WORKER_ACTORS_WITH_PARTITION = ("assign", "seek", "process", "revoke", "lost")
_FAULT_OPS = {"assign": ("validate", "claim", "observe"), "seek": ("observe",),
              "process": ("process", "observe")}
_FAULT_OPS_V2 = {"assign": ("validate", "claim", "observe", "skip", "journal"),
                 "seek": ("observe", "journal"), "process": ("process", "observe", "journal"),
                 "revoke": ("journal",)}
_FAULT_OPS_V3 = {**_FAULT_OPS_V2, "heartbeat": ("heartbeat",)}
_FAULT_OPS_V4 = {**_FAULT_OPS_V3, "assign": (*_FAULT_OPS_V3["assign"], "attempts"),
                 "process": (*_FAULT_OPS_V3["process"], "attempt")}
_FAULT_OPS_V5 = {**_FAULT_OPS_V4, "process": (*_FAULT_OPS_V4["process"], "lane", "fold")}


class TraceError(ValueError):
    """A trace was rejected; the message names the offending place."""


def toolchain() -> dict[str, str]:
    """Provenance: Python major.minor and the installed fenceworker version."""
    return dict(_toolchain())


@functools.cache
def _toolchain() -> dict[str, str]:  # reading package metadata costs more than a short run
    try:
        version = metadata.version("fenceworker")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        version = "unknown"
    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "fenceworker": version}


@dataclass(frozen=True, slots=True)
class SimConfig:
    """The immutable configuration of one run (digested into ``config_digest``)."""

    klass: str
    steps: int
    topic: str
    partitions: int
    group_id: str
    batch_max: int
    budget_ms: int
    low_watermarks_before_drain: tuple[int, ...]
    allow_retention_gap: bool
    topic_recreated_before_drain: bool = False  # version 2; written only when true
    poison: tuple[tuple[int, int], ...] = ()  # version 4 (ops.sim.failures); when any
    transient: tuple[tuple[int, int, int], ...] = ()  # version 4: (partition, offset, n)
    lanes: int = 1  # version 5 (ops.sim.lanes); written only when above 1
    lanes_window: int = 0  # version 5: offsets above the effective frontier; with lanes
    fold_every: int = 0  # version 5: a fold once the effective frontier ran this far ahead

    def to_json(self) -> dict[str, Any]:
        return {"class": self.klass, "steps": self.steps, "topic": self.topic,
                "partitions": self.partitions, "group_id": self.group_id,
                "batch_max": self.batch_max, "budget_ms": self.budget_ms,
                "low_watermarks_before_drain": list(self.low_watermarks_before_drain),
                "allow_retention_gap": self.allow_retention_gap,
                **({"topic_recreated_before_drain": True}
                   if self.topic_recreated_before_drain else {}),
                **({"poison": [list(x) for x in self.poison]} if self.poison else {}),
                **({"transient": [list(x) for x in self.transient]} if self.transient else {}),
                **({"lanes": self.lanes, "lanes_window": self.lanes_window,
                    "fold_every": self.fold_every} if self.lanes > 1 else {})}


@dataclass(frozen=True, slots=True)
class Step:
    actor: str
    worker: int
    partition: int | tuple[int, ...] | None = None  # a tuple: assign/revoke of a set (v2)
    faults: tuple[Fault, ...] = ()  # process of a set: v3
    offset: int | None = None  # expire (v3): the partition's new low watermark

    @property
    def partitions(self) -> tuple[int, ...]:
        """The step's partitions, in order (empty for start and stop)."""
        if self.partition is None:
            return ()
        return self.partition if isinstance(self.partition, tuple) else (self.partition,)


@dataclass(frozen=True, slots=True)
class Trace:
    seed: int
    config: SimConfig
    records: tuple[SourceRecord, ...]
    steps: tuple[Step, ...]
    drain: bool
    toolchain: Mapping[str, str]
    version: int = VERSION


def config_digest(config: SimConfig) -> str:
    raw = json.dumps(config.to_json(), sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode("ascii")


def fault_json(f: Fault) -> dict[str, Any]:
    """One fault selector as it is written in a trace (and echoed in a report's choices)."""
    out: dict[str, Any] = {"operation": f.operation.value, "call": f.call,
                           "outcome": f.outcome.value}
    if f.delay_ms:
        out["delay_ms"] = f.delay_ms
    if f.interleave is not None:
        il: dict[str, Any] = {"at": f.interleave.at}
        if f.interleave.stop:
            il["stop"] = True
        if f.interleave.replacement is not None:
            il["replacement"] = f.interleave.replacement
        if f.interleave.revoke:
            il["revoke"] = True
        if f.interleave.lost:
            il["lost"] = True
        out["interleave"] = il
    return out


def _step_json(s: Step) -> dict[str, Any]:
    out: dict[str, Any] = {"actor": s.actor}
    if s.actor != "expire":
        out["worker"] = s.worker
    if s.offset is not None:
        out["offset"] = s.offset
    if s.partition is not None:
        out["partition"] = list(s.partition) if isinstance(s.partition, tuple) else s.partition
    if s.faults:
        out["faults"] = [fault_json(f) for f in s.faults]
    return out


def to_json(trace: Trace) -> dict[str, Any]:
    return {
        "version": trace.version, "implementation": IMPLEMENTATION,
        "toolchain": dict(trace.toolchain),
        "seed": trace.seed, "config_digest": config_digest(trace.config),
        "config": trace.config.to_json(),
        "records": [{"partition": r.partition, "offset": r.offset, "key": _b64(r.key),
                     "value": _b64(r.value)} for r in trace.records],
        "steps": [_step_json(s) for s in trace.steps], "drain": trace.drain,
    }


def dumps(trace: Trace) -> str:
    """The canonical JSON text of ``trace``."""
    return json.dumps(to_json(trace), sort_keys=True, indent=1, ensure_ascii=True) + "\n"


# -- strict parsing ------------------------------------------------------------------------
def _obj(value: Any, where: str, required: Sequence[str], optional: Sequence[str] = ()
         ) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TraceError(f"{where}: expected an object")
    unknown = sorted(set(value) - set(required) - set(optional))
    if unknown:
        raise TraceError(f"{where}.{unknown[0]}: unknown field")
    missing = [k for k in required if k not in value]
    if missing:
        raise TraceError(f"{where}.{missing[0]}: missing field")
    return value


def _int(value: Any, where: str, *, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise TraceError(f"{where}: expected an integer >= {low}, got {value!r}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise TraceError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise TraceError(f"{where}: expected true or false, got {value!r}")
    return value


def _bytes(value: Any, where: str) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TraceError(f"{where}: expected base64 text or null, got {value!r}")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise TraceError(f"{where}: not base64: {exc}") from exc


def _config(raw: Any, version: int) -> SimConfig:
    keys = ("class", "steps", "topic", "partitions", "group_id", "batch_max", "budget_ms",
            "low_watermarks_before_drain", "allow_retention_gap")
    c = _obj(raw, "config", keys, () if version == 1 else ("topic_recreated_before_drain",)
             if version < 4 else ("topic_recreated_before_drain", "poison", "transient")
             if version < 5 else ("topic_recreated_before_drain", "poison", "transient",
                                  "lanes", "lanes_window", "fold_every"))
    klass = _str(c["class"], "config.class")
    if klass not in ("valid", "conflict"):
        raise TraceError(f"config.class: expected valid or conflict, got {klass!r}")
    partitions = _int(c["partitions"], "config.partitions", low=1)
    lows = c["low_watermarks_before_drain"]
    if not isinstance(lows, list) or len(lows) != partitions:
        raise TraceError("config.low_watermarks_before_drain: expected one integer per partition")
    lanes = c.get("lanes")
    if lanes is None and ("lanes_window" in c or "fold_every" in c):
        raise TraceError("config.lanes: missing field (lanes_window and fold_every need it)")
    if lanes is not None:
        lanes = _int(lanes, "config.lanes", low=2)
        for name in ("lanes_window", "fold_every"):
            if name not in c:
                raise TraceError(f"config.{name}: missing field (lanes need it)")
        if c.get("poison") or c.get("transient"):
            raise TraceError("config.lanes: a lanes config has no poison or transient records")
    return SimConfig(
        klass=klass, steps=_int(c["steps"], "config.steps"), topic=_str(c["topic"], "config.topic"),
        partitions=partitions, group_id=_str(c["group_id"], "config.group_id"),
        batch_max=_int(c["batch_max"], "config.batch_max", low=1),
        budget_ms=_int(c["budget_ms"], "config.budget_ms", low=1),
        low_watermarks_before_drain=tuple(
            _int(v, f"config.low_watermarks_before_drain[{i}]") for i, v in enumerate(lows)),
        allow_retention_gap=_bool(c["allow_retention_gap"], "config.allow_retention_gap"),
        topic_recreated_before_drain=_bool(c.get("topic_recreated_before_drain", False),
                                           "config.topic_recreated_before_drain"),
        poison=tuple((p, o) for p, o in _records_of(c.get("poison", []), "config.poison",
                                                    partitions, 2)),
        transient=tuple((p, o, n) for p, o, n in _records_of(
            c.get("transient", []), "config.transient", partitions, 3)),
        lanes=lanes or 1,
        lanes_window=0 if lanes is None else _int(c["lanes_window"], "config.lanes_window",
                                                  low=1),
        fold_every=0 if lanes is None else _int(c["fold_every"], "config.fold_every", low=1))


def _records_of(raw: Any, where: str, partitions: int, width: int) -> list[tuple[int, ...]]:
    """``[[partition, offset(, n)], ...]`` of the handler-failure records (version 4): each
    listed once; a transient record fails 1 or 2 times (below ``ops.sim.failures.POLICY``'s
    limits)."""
    if not isinstance(raw, list):
        raise TraceError(f"{where}: expected a list")
    out: list[tuple[int, ...]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, list) or len(item) != width:
            raise TraceError(f"{where}[{i}]: expected a list of {width} integers")
        got = tuple(_int(v, f"{where}[{i}][{k}]") for k, v in enumerate(item))
        if got[0] >= partitions:
            raise TraceError(f"{where}[{i}]: partition {got[0]} is not below {partitions}")
        if width == 3 and not 1 <= got[2] <= 2:
            raise TraceError(f"{where}[{i}]: a transient record fails 1 or 2 times, not "
                             f"{got[2]}")
        if got[:2] in [x[:2] for x in out]:
            raise TraceError(f"{where}[{i}]: record {got[0]}@{got[1]} is listed twice")
        out.append(got)
    return out


def _fault(raw: Any, where: str, actor: str, version: int) -> Fault:
    f = _obj(raw, where, ("operation", "call", "outcome"), ("delay_ms", "interleave"))
    op = f["operation"]
    choices = (_FAULT_OPS if version == 1 else _FAULT_OPS_V2 if version == 2
               else _FAULT_OPS_V3 if version == 3 else _FAULT_OPS_V4 if version == 4
               else _FAULT_OPS_V5).get(actor, ())
    if op not in choices:
        raise TraceError(f"{where}.operation: {op!r} is not a choice for a {actor} step "
                         f"in version {version} (choices: {', '.join(choices) or 'none'})")
    try:
        outcome = FaultOutcome(f["outcome"])
    except ValueError:
        raise TraceError(f"{where}.outcome: unknown outcome {f['outcome']!r}") from None
    interleave = None
    if "interleave" in f:
        il = _obj(f["interleave"], f"{where}.interleave", ("at",),
                  ("stop", "replacement") if version == 1 else
                  ("stop", "replacement", "revoke") if version < 4 else
                  ("stop", "replacement", "revoke", "lost"))
        stop = _bool(il.get("stop", False), f"{where}.interleave.stop")
        revoke = _bool(il.get("revoke", False), f"{where}.interleave.revoke")
        lost = _bool(il.get("lost", False), f"{where}.interleave.lost")
        if revoke and (actor != "process" or op not in ("process", "lane")):
            raise TraceError(f"{where}.interleave.revoke: only for a process step's process "
                             "or lane call")
        if lost and (actor != "process" or op != "process"):
            raise TraceError(f"{where}.interleave.lost: only for a process step's process "
                             "call")
        if version < 3 and op in ("validate", "observe"):
            raise TraceError(f"{where}.interleave: an interleave on {op} needs version 3")
        rep = il.get("replacement")
        try:
            interleave = Interleave(il["at"], stop, None if rep is None else
                                    _int(rep, f"{where}.interleave.replacement"),
                                    revoke, lost)
        except TraceError:
            raise
        except ValueError as exc:
            raise TraceError(f"{where}.interleave: {exc}") from None
    try:
        return Fault(Operation(op), _int(f["call"], f"{where}.call", low=1), outcome,
                     _int(f.get("delay_ms", 0), f"{where}.delay_ms"), interleave)
    except TraceError:
        raise
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from None


def _partition(part: Any, where: str, actor: str, partitions: int,
               version: int) -> int | tuple[int, ...]:
    if isinstance(part, list):
        if version == 1 or actor not in ("assign", "revoke", "process", "seek", "lost") or (
                actor == "process" and version < 3) or (actor == "seek" and version < 4):
            raise TraceError(f"{where}.partition: a list is only for assign and revoke "
                             "(version 2), process (version 3), seek and lost (version 4)")
        if not part:
            raise TraceError(f"{where}.partition: expected a non-empty list")
        ps = tuple(_int(v, f"{where}.partition[{k}]") for k, v in enumerate(part))
        if len(set(ps)) != len(ps):
            raise TraceError(f"{where}.partition: a partition is listed twice")
    else:
        ps = (_int(part, f"{where}.partition"),)
    for p in ps:
        if p >= partitions:
            raise TraceError(f"{where}.partition: {p} is not below {partitions}")
    return ps if isinstance(part, list) else ps[0]


def _steps(raw: Any, partitions: int, version: int) -> tuple[Step, ...]:
    if not isinstance(raw, list):
        raise TraceError("steps: expected a list")
    declared: set[int] = set()
    out: list[Step] = []
    for i, rs in enumerate(raw):
        where = f"steps[{i}]"
        actor = rs.get("actor") if isinstance(rs, dict) else None
        if actor == "expire" and version >= 3:
            e = _obj(rs, where, ("actor", "partition", "offset"))
            if isinstance(e["partition"], list):
                raise TraceError(f"{where}.partition: expire takes one partition")
            out.append(Step("expire", 0, _partition(e["partition"], where, actor, partitions,
                                                    version),
                            offset=_int(e["offset"], f"{where}.offset")))
            continue
        if isinstance(rs, dict) and "actor" in rs and (
                actor not in ACTORS or (actor in _V3_ACTORS and version < 3)
                or (actor in _V4_ACTORS and version < 4)):
            raise TraceError(f"{where}.actor: unknown actor {actor!r} in version {version}")
        s = _obj(rs, where, ("actor", "worker"), ("partition", "faults"))
        actor = s["actor"]
        worker = _int(s["worker"], f"{where}.worker")
        if actor == "start":
            if worker in declared:
                raise TraceError(f"{where}.worker: lifetime id {worker} is already used")
            declared.add(worker)
        elif worker not in declared:
            raise TraceError(f"{where}.worker: lifetime {worker} is not started by an earlier step")
        part = s.get("partition")
        if actor in _WORKER_ACTORS_WITH_PARTITION:
            if part is None:
                raise TraceError(f"{where}.partition: missing field")
            part = _partition(part, where, actor, partitions, version)
        elif part is not None:
            raise TraceError(f"{where}.partition: a {actor} step takes no partition")
        faults_raw = s.get("faults", [])
        if not isinstance(faults_raw, list) or ("faults" in s and not faults_raw):
            raise TraceError(f"{where}.faults: expected a non-empty list")
        faults = tuple(_fault(f, f"{where}.faults[{j}]", actor, version)
                       for j, f in enumerate(faults_raw))
        seen: set[tuple[Operation, int]] = set()
        for j, f in enumerate(faults):
            if (f.operation, f.call) in seen:
                raise TraceError(f"{where}.faults[{j}]: a second selector for "
                                 f"{f.operation.value} call {f.call}")
            seen.add((f.operation, f.call))
            rep = None if f.interleave is None else f.interleave.replacement
            if rep is not None:
                if rep in declared:
                    raise TraceError(f"{where}.faults[{j}].interleave.replacement: lifetime id "
                                     f"{rep} is already used")
                declared.add(rep)
        out.append(Step(actor, worker, part, faults))
    return tuple(out)


def _records(raw: Any, partitions: int, topic: str) -> tuple[SourceRecord, ...]:
    if not isinstance(raw, list):
        raise TraceError("records: expected a list")
    last: dict[int, int] = {}
    out: list[SourceRecord] = []
    for i, rr in enumerate(raw):
        where = f"records[{i}]"
        r = _obj(rr, where, ("partition", "offset", "key", "value"))
        p = _int(r["partition"], f"{where}.partition")
        if p >= partitions:
            raise TraceError(f"{where}.partition: {p} is not below {partitions}")
        off = _int(r["offset"], f"{where}.offset")
        if off <= last.get(p, -1):
            raise TraceError(f"{where}.offset: {off} does not increase in partition {p}")
        last[p] = off
        out.append(SourceRecord(topic, p, off, _bytes(r["key"], f"{where}.key"),
                                _bytes(r["value"], f"{where}.value")))
    return tuple(out)


def parse(text: str | bytes) -> Trace:
    """Parse a saved trace strictly; raise ``TraceError`` naming the offending place."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"trace: not UTF-8 at byte {exc.start}") from None
    try:
        raw, end = json.JSONDecoder().raw_decode(text.lstrip())
    except json.JSONDecodeError as exc:
        raise TraceError(f"trace: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                         ) from None
    rest = text.lstrip()[end:]
    if rest.strip():
        raise TraceError(f"trace: trailing content after the JSON object: {rest.strip()[:20]!r}")
    t = _obj(raw, "trace", ("version", "implementation", "toolchain", "seed", "config_digest",
                            "config", "records", "steps", "drain"))
    if t["version"] not in VERSIONS or isinstance(t["version"], bool):
        raise TraceError(f"trace.version: {t['version']!r} is not supported (need one of "
                         f"{', '.join(map(str, VERSIONS))})")
    version = t["version"]
    if t["implementation"] != IMPLEMENTATION:
        raise TraceError(f"trace.implementation: {t['implementation']!r} is not {IMPLEMENTATION}")
    tc = _obj(t["toolchain"], "toolchain", ("python", "fenceworker"))
    mine = toolchain()
    for key in ("python", "fenceworker"):
        if tc[key] != mine[key]:
            raise TraceError(f"toolchain.{key}: trace made with {tc[key]!r}, this is "
                             f"{mine[key]!r} (incompatible provenance)")
    config = _config(t["config"], version)
    if t["config_digest"] != config_digest(config):
        raise TraceError("config_digest: does not match the config (edited or corrupted)")
    return Trace(seed=_int(t["seed"], "seed"), config=config,
                 records=_records(t["records"], config.partitions, config.topic),
                 steps=_steps(t["steps"], config.partitions, version),
                 drain=_bool(t["drain"], "drain"), toolchain=dict(tc), version=version)
