"""The table sink's counts of what it left out, so it is never silent: fields that have no
column, and the changes its version guard found older than the stored row (pure, no I/O;
read by the worker's metrics and member rows, ``fencectl status``).

Rules
- Per table (``schema.name``, unquoted): the records that held at least one field without a
  column, in batches written while ignoring those fields, and the names of those fields (at
  most ``MAX_FIELDS`` per table: a producer's free-form keys must not grow a member row
  without bound). Counted per handler call: a batch written again after a retry (a lost
  COMMIT, a rebalance) is counted again, like the spans of its attempts.
- With ``--sink-version-column``, per table the upserts and deletes the guard left alone
  because the stored row is newer (``StaleChanges``), counted per handler call like the
  unknown fields.
- One of each per process (``UNKNOWN_FIELDS``, ``STALE_CHANGES``): the sink adds from the
  event loop, the metrics read from the scrape's thread (a lock guards both).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["MAX_FIELDS", "STALE_CHANGES", "UNKNOWN_FIELDS", "StaleChanges", "UnknownFields"]

MAX_FIELDS = 20


class UnknownFields:
    """Records with fields that have no column, per table (see the module Rules)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, int] = {}
        self._fields: dict[str, dict[str, None]] = {}

    def add(self, table: str, fields: Iterable[str], records: int) -> None:
        """``records`` records of a batch written into ``table`` held ``fields`` (no column)."""
        with self._lock:
            self._records[table] = self._records.get(table, 0) + records
            names = self._fields.setdefault(table, {})
            for name in fields:
                if len(names) >= MAX_FIELDS:
                    break
                names.setdefault(name, None)

    def records(self) -> dict[str, int]:
        """Per table the records counted so far."""
        with self._lock:
            return dict(self._records)

    def detail(self) -> dict[str, Any]:
        """Per table ``{"records": n, "fields": [names]}`` (for a member row)."""
        with self._lock:
            return {t: {"records": n, "fields": list(self._fields.get(t, {}))}
                    for t, n in self._records.items()}


UNKNOWN_FIELDS = UnknownFields()


class StaleChanges:
    """Changes the version guard left alone (older than the stored row), per table."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, table: str, changes: int) -> None:
        with self._lock:
            self._counts[table] = self._counts.get(table, 0) + changes

    def counts(self) -> dict[str, int]:
        """Per table the changes counted so far (a guarded table appears at 0)."""
        with self._lock:
            return dict(self._counts)


STALE_CHANGES = StaleChanges()
