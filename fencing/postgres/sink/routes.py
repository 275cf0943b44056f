"""The table sink's routing: which table a topic's records go to (``--sink table='{topic}'``,
``table='raw.{topic}'``, ``table='{topic}_rows'``); pure, no I/O.

Rules
- A template is ``NAME`` or ``SCHEMA.NAME`` in which ``{topic}`` may stand, any number of
  times, in ``NAME`` only (the schema must exist; the sink creates tables, never schemas).
  Any other ``{`` or ``}`` is refused, so a mistyped placeholder (``{topics}``) never
  becomes part of a table name. A template without ``{topic}`` names one table for every
  topic (the sink before routing).
- The topic is put in as a quoted identifier, so case and ``-`` are kept. Kafka topic names
  hold ``[a-zA-Z0-9._-]``; of these only ``.`` cannot be in a table name unquoted and would
  read as the schema separator in ``SCHEMA.NAME``, so it becomes ``_``. This maps no two
  topics of one cluster to one table: Kafka refuses to create a topic whose name equals an
  existing one's after the same replacement (``InvalidTopicException: Topic 'a_b' collides
  with existing topic: a.b``, pinned by tests/integration/test_sink_routing.py).
- PostgreSQL cuts identifiers at 63 bytes (``NAMEDATALEN`` - 1) with a NOTICE only, which
  would let two long topic names share a table. A routed name longer than 63 bytes is
  therefore shortened to its first 54 bytes, ``_`` and the first 8 hex digits of the
  SHA-256 of the whole name: distinct names stay distinct (up to a 32-bit hash).
"""

from __future__ import annotations

import hashlib

from fencing.errors import ConfigError

__all__ = ["MAX_NAME_BYTES", "PLACEHOLDER", "check_template", "is_routed", "route"]

PLACEHOLDER = "{topic}"
MAX_NAME_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1
_KEEP_BYTES = MAX_NAME_BYTES - 9  # room for "_" and 8 hex digits


def is_routed(template: str) -> bool:
    """Whether ``template`` routes each topic to a table of its own."""
    return PLACEHOLDER in template


def check_template(template: str) -> None:
    """Raise ``ConfigError`` when ``template`` holds a placeholder the module Rules refuse
    (the ``NAME`` / ``SCHEMA.NAME`` shape is checked by ``SinkSpec``)."""
    schema, _, name = template.rpartition(".")
    if PLACEHOLDER in schema:
        raise ConfigError(f"--sink table={template}: {PLACEHOLDER} may stand in the table's "
                          "name only, not in its schema (the sink creates tables, never "
                          "schemas)")
    rest = name.replace(PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        raise ConfigError(f"--sink table={template}: the only placeholder is {PLACEHOLDER} "
                          "(braces are not allowed otherwise)")


def _shortened(name: str) -> str:
    raw = name.encode()
    if len(raw) <= MAX_NAME_BYTES:
        return name
    head = raw[:_KEEP_BYTES].decode("utf-8", "ignore")  # never half a character
    return f"{head}_{hashlib.sha256(raw).hexdigest()[:8]}"


def route(template: str, topic: str) -> str:
    """The table (``NAME`` or ``SCHEMA.NAME``, unquoted) of ``topic`` under ``template``
    (see the module Rules); ``template`` itself when it holds no placeholder."""
    if not is_routed(template):
        return template
    schema, dot, name = template.rpartition(".")
    return f"{schema}{dot}{_shortened(name.replace(PLACEHOLDER, topic.replace('.', '_')))}"
