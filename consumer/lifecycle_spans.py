"""OpenTelemetry spans of the lifecycle (tracer ``fenceworker``); a no-op without an SDK.

Every span carries ``messaging.system`` = kafka, ``messaging.consumer.group.name`` (the
store's group), ``fence.lifetime`` and, for one partition, ``messaging.destination.name``
and ``messaging.destination.partition.id``. ``fence.outcome`` is ``ok`` or the error's
class name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span

from fencing.types import TopicPartition

__all__ = ["TRACER_NAME", "span", "tp_attrs"]

TRACER_NAME = "fenceworker"
_tracer = trace.get_tracer(TRACER_NAME)


def tp_attrs(tp: TopicPartition) -> dict[str, Any]:
    return {"messaging.destination.name": tp.topic,
            "messaging.destination.partition.id": str(tp.partition)}


@contextmanager
def span(name: str, owner: Any, tp: TopicPartition | None,
         attrs: Mapping[str, Any] | None = None, *, links: Sequence[Link] = (),
         context: Context | None = None) -> Iterator[Span]:
    """Start ``name`` as the current span; record ``fence.outcome`` when it ends."""
    base: dict[str, Any] = {"messaging.system": "kafka",
                            "messaging.consumer.group.name": owner.group_id,
                            "fence.lifetime": owner.lifetime_id}
    if tp is not None:
        base.update(tp_attrs(tp))
    base.update(attrs or {})
    with _tracer.start_as_current_span(name, context=context, links=list(links),
                                       attributes=base) as sp:
        try:
            yield sp
        except BaseException as exc:
            sp.set_attribute("fence.outcome", type(exc).__name__)
            raise
        sp.set_attribute("fence.outcome", "ok")
