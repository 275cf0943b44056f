"""The tracing port: named spans without a dependency on a tracing library.

Rules
- The lifecycle and the guarded store calls open spans only through a ``Tracing`` they are
  given; the default, ``NO_TRACING``, records nothing and costs nothing. The OpenTelemetry
  implementation lives at the edge (``consumer.observability.otel_tracing``) and is wired by
  ``fencectl run``; the simulator and unit tests run the same code without it.
- ``links`` and ``context`` are opaque here (OpenTelemetry ``Link``s and ``Context``); only
  the implementation reads them.
- A span records ``fence.outcome``: ``ok``, or the class name of the error leaving it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

__all__ = ["NO_TRACING", "NoTracing", "SpanHandle", "Tracing"]


class SpanHandle(Protocol):
    """What the code that opened a span may do with it."""

    def set_attribute(self, key: str, value: Any) -> None: ...
    def add_event(self, name: str, attrs: Mapping[str, Any]) -> None: ...


class Tracing(Protocol):
    def span(self, name: str, attrs: Mapping[str, Any], *, links: Sequence[object] = (),
             context: object | None = None) -> AbstractContextManager[SpanHandle]:
        """Open ``name`` as the current span with ``attrs`` until the block ends."""
        ...


class _NullSpan:
    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def add_event(self, name: str, attrs: Mapping[str, Any]) -> None:
        return None


_NULL_SPAN = _NullSpan()


class NoTracing:
    """Records nothing."""

    @contextmanager
    def span(self, name: str, attrs: Mapping[str, Any], *, links: Sequence[object] = (),
             context: object | None = None) -> Iterator[SpanHandle]:
        yield _NULL_SPAN


NO_TRACING = NoTracing()
