"""The reference domain's pure rules: parsing, per-kind decisions, batch folding."""

from __future__ import annotations

import json

import pytest

from fencing.types import ACCEPT, Reject, SourceRecord
from ops.reference.domain import (
    Change,
    DocState,
    Kind,
    Malformed,
    apply_change,
    decide_batch,
    parse_record,
)


def val(kind: str, rev: object, body: object = "b") -> bytes:
    obj: dict[str, object] = {"kind": kind, "rev": rev}
    if body is not None:
        obj["body"] = body
    return json.dumps(obj).encode()


def rec(offset: int, key: bytes | None, value: bytes | None, *, partition: int = 0) -> SourceRecord:
    return SourceRecord("t", partition, offset, key, value)


LIVE = DocState(revision=3, body="three", withdrawn=False, partition=0, offset=9)
GONE = DocState(revision=4, body="three", withdrawn=True, partition=0, offset=10)


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        (None, val("put", 1), Malformed.NO_KEY),
        (b"\xff", val("put", 1), Malformed.KEY_NOT_UTF8),
        (b"", val("put", 1), Malformed.KEY_INVALID),
        (b"a\x00b", val("put", 1), Malformed.KEY_INVALID),
        (b"x" * 257, val("put", 1), Malformed.KEY_INVALID),
        (b"d", None, Malformed.NO_VALUE),
        (b"d", b"\xc3\x28", Malformed.NOT_UTF8),
        (b"d", b"{nope", Malformed.NOT_JSON),
        (b"d", b"", Malformed.NOT_JSON),
        (b"d", b"[1]", Malformed.NOT_OBJECT),
        (b"d", b'"put"', Malformed.NOT_OBJECT),
        (b"d", val("publish", 1), Malformed.BAD_KIND),
        (b"d", b'{"rev": 1, "body": "x"}', Malformed.BAD_KIND),
        (b"d", val("put", "1"), Malformed.BAD_REV),
        (b"d", val("put", 0), Malformed.BAD_REV),
        (b"d", val("put", True), Malformed.BAD_REV),
        (b"d", val("put", 1.0), Malformed.BAD_REV),
        (b"d", val("put", 1, None), Malformed.BAD_BODY),
        (b"d", val("correct", 2, 7), Malformed.BAD_BODY),
        (b"d", val("put", 1, "nul\x00"), Malformed.BAD_BODY),
        (b"d", b'{"kind": "put", "rev": 1, "body": "\\ud800"}', Malformed.BAD_BODY),
    ],
)
def test_malformed_records_are_named(
    key: bytes | None, value: bytes | None, why: Malformed
) -> None:
    assert parse_record(key, value) is why


def test_well_formed_record_parses_and_withdraw_ignores_body() -> None:
    c = parse_record(b"doc-1", val("correct", 2, "new", ))
    assert not isinstance(c, Malformed)
    assert (c.doc_id, c.kind, c.rev, c.body) == ("doc-1", Kind.CORRECT, 2, "new")
    w = parse_record("dé".encode(), b'{"kind": "withdraw", "rev": 5, "body": 3, "extra": []}')
    assert not isinstance(w, Malformed)
    assert (w.doc_id, w.kind, w.rev, w.body) == ("dé", Kind.WITHDRAW, 5, None)


def change(kind: str, rev: int, body: str | None = "b") -> Change:
    c = parse_record(b"d", val(kind, rev, body))
    assert not isinstance(c, Malformed)
    return c


@pytest.mark.parametrize(
    ("current", "kind", "rev", "expected"),
    [
        (None, "put", 1, DocState(1, "b", False, 1, 20)),
        (None, "put", 2, Reject("put-revision-not-1: rev 2")),
        (LIVE, "put", 1, Reject("document-exists")),
        (GONE, "put", 1, Reject("withdrawn-document")),
        (None, "correct", 1, Reject("missing-document")),
        (None, "withdraw", 1, Reject("missing-document")),
        (LIVE, "correct", 4, DocState(4, "b", False, 1, 20)),
        (LIVE, "withdraw", 4, DocState(4, "three", True, 1, 20)),
        (LIVE, "correct", 3, Reject("stale-revision: rev 3, current 3")),
        (LIVE, "correct", 1, Reject("stale-revision: rev 1, current 3")),
        (LIVE, "withdraw", 6, Reject("skipped-revision: rev 6, current 3")),
        (GONE, "correct", 5, Reject("withdrawn-document")),
        (GONE, "withdraw", 5, Reject("withdrawn-document")),
    ],
)
def test_apply_change_rules(
    current: DocState | None, kind: str, rev: int, expected: object
) -> None:
    got = apply_change(current, change(kind, rev), partition=1, offset=20)
    assert got == expected


def test_decide_batch_folds_in_order_and_numbers_outbox() -> None:
    records = [
        rec(0, b"a", val("put", 1, "a1")),
        rec(1, b"a", val("correct", 2, "a2")),
        rec(2, b"a", val("correct", 2, "again")),  # stale within the batch
        rec(3, b"b", val("correct", 4, "b4")),  # against stored state
        rec(4, b"a", b"\xff"),
        rec(5, b"a", val("withdraw", 3)),
        rec(6, b"a", val("correct", 4, "late")),
    ]
    stored = {("t", "b"): DocState(3, "b3", False, 0, 1)}
    d = decide_batch(records, stored)
    assert d.verdicts == (
        ACCEPT,
        ACCEPT,
        Reject("stale-revision: rev 2, current 2"),
        ACCEPT,
        Reject("malformed: value is not UTF-8"),
        ACCEPT,
        Reject("withdrawn-document"),
    )
    assert dict(d.documents) == {
        ("t", "a"): DocState(3, "a2", True, 0, 5),
        ("t", "b"): DocState(4, "b4", False, 0, 3),
    }
    assert [(e.doc_id, e.seq, e.version, e.kind, e.body, e.offset) for e in d.outbox] == [
        ("a", 1, 1, Kind.PUT, "a1", 0),
        ("a", 2, 2, Kind.CORRECT, "a2", 1),
        ("b", 4, 4, Kind.CORRECT, "b4", 3),
        ("a", 3, 3, Kind.WITHDRAW, None, 5),
    ]


def test_decide_batch_keys_documents_by_topic() -> None:
    records = [
        SourceRecord("t1", 0, 0, b"a", val("put", 1)),
        SourceRecord("t2", 0, 0, b"a", val("put", 1)),
    ]
    d = decide_batch(records, {})
    assert d.verdicts == (ACCEPT, ACCEPT)
    assert set(d.documents) == {("t1", "a"), ("t2", "a")}


def test_decide_batch_never_raises_on_garbage() -> None:
    garbage = [rec(i, bytes([i % 256]) * (i % 5), bytes(range(i % 256))) for i in range(300)]
    d = decide_batch(garbage, {})
    assert len(d.verdicts) == 300
    assert all(isinstance(v, Reject) and v.reason.startswith("malformed: ") for v in d.verdicts)
