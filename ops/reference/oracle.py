"""The independent oracle of the reference domain: folds a source into the expected
documents, outbox and quarantine. Written from the specification in
``fencing/reference/__init__.py``; it imports neither the handler nor ``domain``.

API (everything a test or the simulator needs)
- ``fold(records)`` -> ``Expected``: records are objects with ``topic``, ``partition``,
  ``offset``, ``key``, ``value`` (``SourceRecord``), given in processing order per
  partition (offsets strictly increasing per partition; interleaving across partitions
  does not matter). Raises ``ValueError`` if offsets go backwards in a partition or one
  document appears in two partitions (then cross-partition order would matter).
- ``fold_prefix(source, frontiers)`` -> ``Expected``: fold of the records of each
  partition with ``offset < frontiers[(topic, partition)]`` (missing partition: none).
- ``Folder``: the same fold one record at a time (``add``), its ``state()`` at any point
  equal to ``fold`` of the records added so far (the simulator folds each partition
  once per run instead of the whole prefix at every check).
- ``diff(expected, actual)`` -> list of human-readable mismatches (empty when equal).
- ``outbox_problems(state)`` -> mismatches between outbox and documents: per document
  the outbox sequences are 1..n without gaps, version == seq, the document's revision
  is n, its body/withdrawn match the last entry, and only the last entry may be a withdraw.
- ``progress_problems(state, frontiers)`` -> quarantine rows at or past their frontier.
- ``check(source, frontiers, actual)`` -> all of the above for committed state ``actual``
  against the source prefix below ``frontiers``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Doc",
    "Expected",
    "Folder",
    "OutboxRow",
    "check",
    "diff",
    "fold",
    "fold_prefix",
    "outbox_problems",
    "progress_problems",
]


@dataclass(frozen=True, slots=True)
class Doc:
    """Expected document row (source of the last accepted change included)."""

    revision: int
    body: str | None
    withdrawn: bool
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """Expected outbox row, keyed by (topic, doc_id, seq) in ``Expected.outbox``."""

    version: int
    kind: str
    body: str | None
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Expected:
    """documents[(topic, doc_id)], outbox[(topic, doc_id, seq)],
    quarantine[(topic, partition, offset)] = reason."""

    documents: Mapping[tuple[str, str], Doc] = field(default_factory=dict)
    outbox: Mapping[tuple[str, str, int], OutboxRow] = field(default_factory=dict)
    quarantine: Mapping[tuple[str, int, int], str] = field(default_factory=dict)


def _text_ok(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in s


def _read(key: bytes | None, value: bytes | None) -> tuple[str, str, int, str | None] | str:
    """(doc_id, kind, rev, body) or a malformed reason."""
    if key is None:
        return "malformed: no key"
    try:
        doc_id = key.decode("utf-8")
    except UnicodeDecodeError:
        return "malformed: key is not UTF-8"
    if len(key) == 0 or len(key) > 256 or "\x00" in doc_id:
        return "malformed: key is empty, longer than 256 bytes or contains NUL"
    if value is None:
        return "malformed: no value"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "malformed: value is not UTF-8"
    try:
        obj: Any = json.loads(text)
    except (ValueError, RecursionError):
        return "malformed: value is not JSON"
    if type(obj) is not dict:
        return "malformed: value is not a JSON object"
    kind = obj.get("kind")
    if kind not in ("put", "correct", "withdraw"):
        return "malformed: kind is missing or unknown"
    rev = obj.get("rev")
    if type(rev) is not int or rev <= 0:
        return "malformed: rev is missing or not a positive integer"
    if kind == "withdraw":
        return doc_id, kind, rev, None
    body = obj.get("body")
    if type(body) is not str or not _text_ok(body):
        return "malformed: body is missing, not a string or not storable"
    return doc_id, kind, rev, body


class _Fold:
    def __init__(self) -> None:
        self.docs: dict[tuple[str, str], Doc] = {}
        self.outbox: dict[tuple[str, str, int], OutboxRow] = {}
        self.count: dict[tuple[str, str], int] = {}
        self.quarantine: dict[tuple[str, int, int], str] = {}
        self.last: dict[tuple[str, int], int] = {}
        self.home: dict[tuple[str, str], int] = {}

    def step(self, rec: Any) -> None:
        tp = (rec.topic, rec.partition)
        if self.last.get(tp, -1) >= rec.offset:
            raise ValueError(f"offset {rec.offset} of {tp} is not after {self.last[tp]}")
        self.last[tp] = rec.offset
        parsed = _read(rec.key, rec.value)
        where = (rec.topic, rec.partition, rec.offset)
        if isinstance(parsed, str):
            self.quarantine[where] = parsed
            return
        doc_id, kind, rev, body = parsed
        dk = (rec.topic, doc_id)
        home = self.home.setdefault(dk, rec.partition)
        if home != rec.partition:
            raise ValueError(f"document {dk} appears in partitions {home} and {rec.partition}")
        reason = self._reason(self.docs.get(dk), kind, rev)
        if reason is not None:
            self.quarantine[where] = reason
            return
        old = self.docs.get(dk)
        if kind == "withdraw":
            assert old is not None
            body = old.body
        self.docs[dk] = Doc(rev, body, kind == "withdraw", rec.partition, rec.offset)
        n = self.count.get(dk, 0) + 1
        self.count[dk] = n
        ob_body = None if kind == "withdraw" else body
        row = OutboxRow(rev, kind, ob_body, rec.partition, rec.offset)
        self.outbox[(rec.topic, doc_id, n)] = row

    @staticmethod
    def _reason(doc: Doc | None, kind: str, rev: int) -> str | None:
        if kind == "put":
            if doc is not None:
                return "withdrawn-document" if doc.withdrawn else "document-exists"
            return None if rev == 1 else f"put-revision-not-1: rev {rev}"
        if doc is None:
            return "missing-document"
        if doc.withdrawn:
            return "withdrawn-document"
        if rev <= doc.revision:
            return f"stale-revision: rev {rev}, current {doc.revision}"
        if rev > doc.revision + 1:
            return f"skipped-revision: rev {rev}, current {doc.revision}"
        return None


class Folder:
    """An incremental ``fold``: ``add`` records in the order ``fold`` takes them;
    ``state()`` equals ``fold`` of every record added so far (fresh mappings)."""

    def __init__(self) -> None:
        self._fold = _Fold()
        self.added = 0

    def add(self, rec: Any) -> None:
        self._fold.step(rec)
        self.added += 1

    def state(self) -> Expected:
        f = self._fold
        return Expected(dict(f.docs), dict(f.outbox), dict(f.quarantine))


def fold(records: Iterable[Any]) -> Expected:
    """The expected state after processing ``records`` (see module doc for ordering)."""
    f = _Fold()
    for rec in records:
        f.step(rec)
    return Expected(f.docs, f.outbox, f.quarantine)


def fold_prefix(source: Iterable[Any], frontiers: Mapping[tuple[str, int], int]) -> Expected:
    """Fold of the records below each partition's frontier."""
    return fold(r for r in source if r.offset < frontiers.get((r.topic, r.partition), 0))


def _diff_map(name: str, exp: Mapping[Any, Any], act: Mapping[Any, Any], limit: int) -> list[str]:
    out: list[str] = []
    for k in sorted(set(exp) | set(act), key=repr):
        e, a = exp.get(k), act.get(k)
        if e != a:
            out.append(f"{name}[{k!r}]: expected {e!r}, actual {a!r}")
            if len(out) >= limit:
                out.append(f"{name}: further differences not shown")
                break
    return out


def diff(expected: Expected, actual: Expected, *, limit: int = 20) -> list[str]:
    """Mismatches between two states (at most ``limit`` per table); empty when equal."""
    return [
        *_diff_map("documents", expected.documents, actual.documents, limit),
        *_diff_map("outbox", expected.outbox, actual.outbox, limit),
        *_diff_map("quarantine", expected.quarantine, actual.quarantine, limit),
    ]


def outbox_problems(state: Expected) -> list[str]:
    """Outbox/document consistency of one state (see module doc); empty when consistent."""
    per_doc: dict[tuple[str, str], list[tuple[int, OutboxRow]]] = {}
    for (topic, doc_id, seq), row in state.outbox.items():
        per_doc.setdefault((topic, doc_id), []).append((seq, row))
    out: list[str] = []
    for dk in sorted(set(per_doc) | set(state.documents)):
        rows = sorted(per_doc.get(dk, []), key=lambda x: x[0])
        seqs = [s for s, _ in rows]
        if seqs != list(range(1, len(seqs) + 1)):
            out.append(f"outbox of {dk}: sequences {seqs} are not 1..{len(seqs)}")
        out.extend(
            f"outbox of {dk}: seq {s} has version {r.version}" for s, r in rows if r.version != s
        )
        out.extend(
            f"outbox of {dk}: withdraw at seq {s} is not last"
            for s, r in rows[:-1]
            if r.kind == "withdraw"
        )
        doc = state.documents.get(dk)
        if doc is None or not rows:
            out.append(f"{dk}: document {doc!r} without outbox rows or outbox without document")
            continue
        last = rows[-1][1]
        if doc.revision != len(rows) or doc.withdrawn != (last.kind == "withdraw"):
            out.append(f"{dk}: document {doc!r} disagrees with last outbox row {last!r}")
        if last.kind != "withdraw" and doc.body != last.body:
            out.append(f"{dk}: document body differs from last outbox body")
    return out


def progress_problems(state: Expected, frontiers: Mapping[tuple[str, int], int]) -> list[str]:
    """Quarantine rows and document sources at or past their partition's frontier."""
    out = [
        f"quarantine row {k!r} is not below frontier {frontiers.get((k[0], k[1]), 0)}"
        for k in state.quarantine
        if k[2] >= frontiers.get((k[0], k[1]), 0)
    ]
    out.extend(
        f"outbox row {k!r} comes from offset {r.offset}, not below its frontier"
        for k, r in state.outbox.items()
        if r.offset >= frontiers.get((k[0], r.partition), 0)
    )
    return out


def check(
    source: Sequence[Any], frontiers: Mapping[tuple[str, int], int], actual: Expected
) -> list[str]:
    """Every problem of committed state ``actual`` against the fold of the source prefix
    below ``frontiers`` (keys (topic, partition), values the next offset to process)."""
    return [
        *progress_problems(actual, frontiers),
        *outbox_problems(actual),
        *diff(fold_prefix(source, frontiers), actual),
    ]
