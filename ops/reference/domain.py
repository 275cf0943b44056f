"""The reference domain: a document-amendments ledger. Pure decision rules, no I/O.

Record format (one Kafka record = one change of one document)
- key: the document id, UTF-8, 1..256 bytes, no NUL.
- value: a UTF-8 JSON object ``{"kind": K, "rev": R, "body": B}``:
  ``kind`` is ``"put"``, ``"correct"`` or ``"withdraw"``; ``rev`` is a positive integer;
  ``body`` is a string (required for put and correct, ignored for withdraw).
  Other fields are ignored.

Rules (checked in this order; the first that fails names the rejection reason)
1. The record is well formed (see ``Malformed``), else ``malformed: <what>``.
2. put: the document must not exist (``document-exists``, or ``withdrawn-document``
   when it exists and is withdrawn) and ``rev`` must be 1 (``put-revision-not-1: rev R``).
3. correct / withdraw: the document must exist (``missing-document``), must not be
   withdrawn (``withdrawn-document``), and ``rev`` must be current + 1
   (``stale-revision: rev R, current C`` when R <= C,
   ``skipped-revision: rev R, current C`` when R > C + 1).
4. Accepted: the document's revision becomes ``rev`` (correct replaces the body,
   withdraw keeps the last body and sets withdrawn), and one outbox entry is appended
   with ``seq`` = the document's count of accepted changes (1, 2, 3, ... without gaps)
   and ``version`` = ``rev``.

Documents are keyed by (topic, doc id). Records of one document must stay in one
partition (the generator keys by doc id), so only per-partition order matters.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fencing.jsontext import reader
from fencing.types import ACCEPT, Reject, SourceRecord, Verdict

__all__ = [
    "KEY_BYTES_MAX",
    "BatchDecision",
    "Change",
    "DocKey",
    "DocState",
    "Kind",
    "Malformed",
    "OutboxEntry",
    "Reason",
    "apply_change",
    "batch_keys",
    "decide_batch",
    "parse_batch",
    "parse_record",
]

KEY_BYTES_MAX = 256

DocKey = tuple[str, str]  # (topic, doc_id)


class Kind(enum.Enum):
    """What a record does to its document."""

    PUT = "put"
    CORRECT = "correct"
    WITHDRAW = "withdraw"


class Reason(enum.Enum):
    """Stable rejection codes; the reason string starts with the code."""

    MALFORMED = "malformed"
    DOCUMENT_EXISTS = "document-exists"
    PUT_REVISION_NOT_1 = "put-revision-not-1"
    MISSING_DOCUMENT = "missing-document"
    WITHDRAWN_DOCUMENT = "withdrawn-document"
    STALE_REVISION = "stale-revision"
    SKIPPED_REVISION = "skipped-revision"


class Malformed(enum.Enum):
    """Why a record could not be parsed; the reason string is ``malformed: <value>``."""

    NO_KEY = "no key"
    KEY_NOT_UTF8 = "key is not UTF-8"
    KEY_INVALID = "key is empty, longer than 256 bytes or contains NUL"
    NO_VALUE = "no value"
    NOT_UTF8 = "value is not UTF-8"
    NOT_JSON = "value is not JSON"
    NOT_OBJECT = "value is not a JSON object"
    BAD_KIND = "kind is missing or unknown"
    BAD_REV = "rev is missing or not a positive integer"
    BAD_BODY = "body is missing, not a string or not storable"


@dataclass(frozen=True, slots=True)
class Change:
    """A well-formed record: one change of one document."""

    doc_id: str
    kind: Kind
    rev: int
    body: str | None


@dataclass(frozen=True, slots=True)
class DocState:
    """A document row: revision, body, withdrawn flag, source of the last accepted change."""

    revision: int
    body: str | None
    withdrawn: bool
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One accepted change as published to the outbox."""

    topic: str
    doc_id: str
    seq: int
    version: int
    kind: Kind
    body: str | None
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """Verdicts in record order, the final state of every changed document, the outbox rows."""

    verdicts: tuple[Verdict, ...]
    documents: Mapping[DocKey, DocState]
    outbox: tuple[OutboxEntry, ...]


def _storable(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from JSON escapes
        return False
    return True


def _parse_key(key: bytes | None) -> str | Malformed:
    if key is None:
        return Malformed.NO_KEY
    try:
        doc_id = key.decode("utf-8")
    except UnicodeDecodeError:
        return Malformed.KEY_NOT_UTF8
    if not key or len(key) > KEY_BYTES_MAX or "\x00" in doc_id:
        return Malformed.KEY_INVALID
    return doc_id


#: ``json.loads`` at the cost of its scanner (``fencing.jsontext``): the same value or error
_loads = reader(json.loads, json.JSONDecoder())


def _parse_value(value: bytes | None) -> dict[str, object] | Malformed:
    if value is None:
        return Malformed.NO_VALUE
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return Malformed.NOT_UTF8
    try:
        obj = _loads(text)
    except (ValueError, RecursionError):
        return Malformed.NOT_JSON
    return obj if isinstance(obj, dict) else Malformed.NOT_OBJECT


def parse_record(key: bytes | None, value: bytes | None) -> Change | Malformed:
    """Parse one record; never raises. Returns the change or why it is malformed."""
    doc_id = _parse_key(key)
    if isinstance(doc_id, Malformed):
        return doc_id
    obj = _parse_value(value)
    if isinstance(obj, Malformed):
        return obj
    try:
        kind = Kind(obj.get("kind"))
    except ValueError:
        return Malformed.BAD_KIND
    rev = obj.get("rev")
    if not isinstance(rev, int) or isinstance(rev, bool) or rev < 1:
        return Malformed.BAD_REV
    body = obj.get("body")
    if kind is Kind.WITHDRAW:
        body = None
    elif not isinstance(body, str) or not _storable(body):
        return Malformed.BAD_BODY
    return Change(doc_id=doc_id, kind=kind, rev=rev, body=body)


def apply_change(
    current: DocState | None, change: Change, *, partition: int, offset: int
) -> DocState | Reject:
    """The document after ``change``, or the rejection; ``current`` None = missing document."""
    if change.kind is Kind.PUT:
        if current is not None:
            code = Reason.WITHDRAWN_DOCUMENT if current.withdrawn else Reason.DOCUMENT_EXISTS
            return Reject(code.value)
        if change.rev != 1:
            return Reject(f"{Reason.PUT_REVISION_NOT_1.value}: rev {change.rev}")
        return DocState(1, change.body, False, partition, offset)
    if current is None:
        return Reject(Reason.MISSING_DOCUMENT.value)
    if current.withdrawn:
        return Reject(Reason.WITHDRAWN_DOCUMENT.value)
    if change.rev != current.revision + 1:
        code = Reason.STALE_REVISION if change.rev <= current.revision else Reason.SKIPPED_REVISION
        return Reject(f"{code.value}: rev {change.rev}, current {current.revision}")
    if change.kind is Kind.WITHDRAW:
        return DocState(change.rev, current.body, True, partition, offset)
    return DocState(change.rev, change.body, False, partition, offset)


def batch_keys(
    records: Iterable[SourceRecord], parsed: Sequence[Change | Malformed]
) -> set[DocKey]:
    """The (topic, doc id) of every well-formed record: the rows the handler must read."""
    return {
        (rec.topic, ch.doc_id)
        for rec, ch in zip(records, parsed, strict=True)
        if isinstance(ch, Change)
    }


def parse_batch(records: Iterable[SourceRecord]) -> list[Change | Malformed]:
    """``parse_record`` of every record, in order."""
    return [parse_record(rec.key, rec.value) for rec in records]


def decide_batch(
    records: Sequence[SourceRecord],
    current: Mapping[DocKey, DocState],
    *,
    parsed: Sequence[Change | Malformed] | None = None,
) -> BatchDecision:
    """Fold ``records`` in order over ``current`` (the stored state of the batch's documents;
    absent keys are missing documents). ``parsed`` is ``parse_batch(records)`` when the
    caller already has it. Never raises on bad input."""
    state: dict[DocKey, DocState] = {}
    verdicts: list[Verdict] = []
    outbox: list[OutboxEntry] = []
    changes = parse_batch(records) if parsed is None else parsed
    for rec, change in zip(records, changes, strict=True):
        if isinstance(change, Malformed):
            verdicts.append(Reject(f"{Reason.MALFORMED.value}: {change.value}"))
            continue
        dk = (rec.topic, change.doc_id)
        before = state.get(dk, current.get(dk))
        after = apply_change(before, change, partition=rec.partition, offset=rec.offset)
        if isinstance(after, Reject):
            verdicts.append(after)
            continue
        state[dk] = after
        verdicts.append(ACCEPT)
        outbox.append(
            OutboxEntry(
                topic=rec.topic,
                doc_id=change.doc_id,
                seq=after.revision,
                version=change.rev,
                kind=change.kind,
                body=after.body if change.kind is not Kind.WITHDRAW else None,
                partition=rec.partition,
                offset=rec.offset,
            )
        )
    return BatchDecision(tuple(verdicts), state, tuple(outbox))
