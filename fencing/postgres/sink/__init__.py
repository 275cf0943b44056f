"""The built-in table sink (see ``fencing.postgres.sink.table``)."""

from fencing.postgres.sink.table import Method, SinkSpec, ensure_table, make_table_sink, table_sink

__all__ = ["Method", "SinkSpec", "ensure_table", "make_table_sink", "table_sink"]
