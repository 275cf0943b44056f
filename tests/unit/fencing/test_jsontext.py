"""``fencing.jsontext.reader`` is ``json.loads`` (or a decoder's ``decode``) for every text:
the same value, or the same exception with the same message."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from fencing.jsontext import reader
from fencing.postgres.sink.rows import Misfit, _decode, _nonfinite

TRICKY = [
    '{"id":"o0","amount":0,"status":"new"}',
    ' {"a":1}', '{"a":1} ', '\n{"a":1}\r\n\t', '\ufeff{"a":1}', '{"a":1}x', '{"a":1}{"b":2}',
    "", " ", "x", "{", "}", '{"a":}', '{"a" 1}', "[1,]", "[1 2]", "1 2", '"\\ud800"',
    '"\\x41"', '"a\nb"', '"\\u00e9\\n"', "NaN", "-Infinity", '{"n":[1,NaN]}', "Infinity ",
    "1", "-0", "1e400", "0.1", "true", "null", "[]", "{}", '{"a":{"b":[{"c":null}]}}',
    '{"a":1,"a":2}', '{"dup":"x","dup":"y"}', "[" * 100_000 + "]" * 100_000, "01", "1.",
]


def outcome(fn: Callable[[str], Any], text: str) -> tuple[str, Any]:
    try:
        return "value", fn(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and Misfit are ValueErrors
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("text", TRICKY, ids=range(len(TRICKY)))
def test_reader_is_json_loads_on_tricky_texts(text: str) -> None:
    fast = reader(json.loads, json.JSONDecoder())
    assert outcome(fast, text) == outcome(json.loads, text)


@pytest.mark.parametrize("text", TRICKY, ids=range(len(TRICKY)))
def test_reader_is_the_decoders_decode_with_its_parse_constant(text: str) -> None:
    decoder = json.JSONDecoder(parse_constant=_nonfinite)
    assert outcome(reader(decoder.decode, decoder), text) == outcome(decoder.decode, text)


def test_the_sinks_decode_refuses_non_finite_numbers_as_before() -> None:
    with pytest.raises(Misfit, match="non-finite number"):
        _decode('{"x": [1, -Infinity]}')
    assert _decode('{"x": 1}') == {"x": 1}


def test_reader_is_json_loads_on_mutated_documents() -> None:
    """Every byte-level damage of real-looking documents (seeded): same value or error."""
    rng = random.Random(20261202)
    fast = reader(json.loads, json.JSONDecoder())
    alphabet = ' \t\n{}[]":,.-+0123456789eEaxtrufnl\\\ufeff'
    differed: list[str] = []
    for i in range(20_000):
        doc = json.dumps({"id": f"o{i}", "amount": rng.randint(-10**6, 10**6),
                          "status": rng.choice(["new", "paid", "é\n"]),
                          "items": [rng.random(), None, True]},
                         separators=rng.choice([(",", ":"), (", ", ": ")]))
        chars = list(doc)
        for _ in range(rng.randint(0, 3)):
            at = rng.randrange(len(chars) + 1)
            op = rng.randrange(3)
            if op == 0:
                chars.insert(at, rng.choice(alphabet))
            elif chars and at < len(chars):
                if op == 1:
                    del chars[at]
                else:
                    chars[at] = rng.choice(alphabet)
        text = "".join(chars)
        if outcome(fast, text) != outcome(json.loads, text):
            differed.append(text)
    assert differed == []
