"""Reading one JSON document per record, at the cost of the parse alone (pure, no I/O).

Rules
- ``reader(whole, decoder)`` returns a function equal to ``whole`` (``json.loads``, or a
  ``JSONDecoder``'s ``decode``, configured as ``decoder``) for every text: the same value,
  the same exception. It first runs ``decoder``'s scanner at index 0, the one call inside
  ``decode`` that parses; a text the scanner cannot take whole (leading or trailing
  whitespace, a BOM, trailing data, no value at 0) goes to ``whole``, which reads it or
  raises exactly as before. A malformed document raises from the scanner the error
  ``whole`` raises: ``whole`` runs the same scanner at the same index 0.
- Why: in CPython 3.11 ``json.loads`` of a 100-byte object costs ~2.2 µs, of which the
  scanner is ~0.8 µs; the rest is ``loads``' argument checks, ``decode``'s two whitespace
  regex matches and ``raw_decode``'s frame (``python -m ops.bench.hotpath``: the table
  sink's conversion and the reference handler's parse, before and after, in docs/benchmarks.md).
  ``JSONDecoder.scan_once`` is the attribute every ``decode`` calls (``json/decoder.py``:
  ``raw_decode``), set by ``JSONDecoder.__init__`` since Python 2.6.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["reader"]


def reader(whole: Callable[[str], Any], decoder: json.JSONDecoder) -> Callable[[str], Any]:
    """``whole`` (which must decode as ``decoder`` does) with the scanner-only fast path."""
    # set by JSONDecoder.__init__ (json/decoder.py), not declared in typeshed's stub
    scan: Callable[[str, int], tuple[Any, int]] = decoder.scan_once  # type: ignore[attr-defined]

    def read(text: str) -> Any:
        try:
            obj, end = scan(text, 0)
        except StopIteration:  # no value at index 0: whitespace, a BOM, or not JSON
            return whole(text)
        if end != len(text):  # trailing whitespace (allowed) or data (an error): whole's call
            return whole(text)
        return obj

    return read
