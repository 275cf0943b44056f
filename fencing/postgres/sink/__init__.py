"""The built-in table sink (rules in ``fencing.postgres.sink.table``)."""

from fencing.postgres.sink.catalog import Method, SinkSpec, ensure_table
from fencing.postgres.sink.table import make_table_sink, table_sink

__all__ = ["Method", "SinkSpec", "ensure_table", "make_table_sink", "table_sink"]
