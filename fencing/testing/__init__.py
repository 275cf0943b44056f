"""The handler test kit: check that a handler keeps exactly-once effects under lost COMMIT
replies, aborts, replays under a new epoch and re-split batches, through the real PostgreSQL
store, from a plain pytest with only a DSN (no Kafka). See ``fencing.testing.kit`` and the
docs/test-kit.md."""

from fencing.testing.kit import HandlerUnsafe, KitReport, check_handler, check_handler_async
from fencing.testing.plan import ALL_FAULTS, Fault
from fencing.testing.records import json_records

__all__ = ["ALL_FAULTS", "Fault", "HandlerUnsafe", "KitReport", "check_handler",
           "check_handler_async", "json_records"]
