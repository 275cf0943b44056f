"""``to_record`` fills ``SourceRecord``'s slots directly (a hot path): the result must be
the same value the dataclass constructor builds, and still frozen."""

from __future__ import annotations

import dataclasses

import pytest
from confluent_kafka import Message

from consumer.kafka.adapter import to_record
from fencing.types import SourceRecord


def test_a_record_with_headers_and_timestamp_equals_the_constructed_one() -> None:
    msg = Message(topic="t", partition=2, offset=41, key=b"k", value=b"v",
                  headers=[("traceparent", b"00-ab"), ("empty", None)], timestamp=(1, 1234))
    rec = to_record(msg)
    assert rec == SourceRecord(topic="t", partition=2, offset=41, key=b"k", value=b"v",
                               headers=(("traceparent", b"00-ab"), ("empty", None)),
                               timestamp_ms=1234)
    assert hash(rec) == hash(SourceRecord("t", 2, 41, b"k", b"v",
                                          (("traceparent", b"00-ab"), ("empty", None)), 1234))


def test_no_headers_no_timestamp_and_null_key_value() -> None:
    rec = to_record(Message(topic="t", partition=0, offset=0, key=None, value=None,
                            timestamp=(0, 0)))
    assert rec == SourceRecord("t", 0, 0, None, None, (), None)
    assert rec.tp.partition == 0


def test_the_translated_record_is_still_frozen() -> None:
    rec = to_record(Message(topic="t", partition=0, offset=1, key=b"k", value=b"v",
                            timestamp=(1, 5)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.offset = 2  # type: ignore[misc]
