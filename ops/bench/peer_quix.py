"""The peer of ``ops.bench.peer``: Quix Streams' PostgreSQL sink, run as its users run it.

Runs in its own virtualenv (``.venv-peer``, made by ``python -m ops.bench.peer
--ensure-venv``): quixstreams 3.28 requires confluent-kafka < 2.13, older than the worker's.
Never imported by fenceworker. Settings from the environment as ``fencectl run`` takes them
(``KAFKA_BOOTSTRAP_SERVERS``, ``FENCE_DSN``: the password never in argv); Quix's own
defaults otherwise (at-least-once, a checkpoint every 5 s), reading from the earliest offset.
"""

from __future__ import annotations

import argparse
import os
from urllib.parse import unquote, urlsplit

from quixstreams import Application
from quixstreams.sinks.community.postgresql import PostgreSQLSink


def main() -> None:
    p = argparse.ArgumentParser(prog="python ops/bench/peer_quix.py")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--schema", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--upsert", action="store_true", help="upsert on id (else insert)")
    p.add_argument("--state-dir", required=True, help="Quix's state folder")
    a = p.parse_args()
    dsn = urlsplit(os.environ["FENCE_DSN"])
    app = Application(broker_address=os.environ["KAFKA_BOOTSTRAP_SERVERS"],
                      consumer_group=a.group, auto_offset_reset="earliest",
                      state_dir=a.state_dir, loglevel="WARNING")
    sink = PostgreSQLSink(host=dsn.hostname or "127.0.0.1", port=dsn.port or 5432,
                          dbname=dsn.path.lstrip("/"), user=unquote(dsn.username or ""),
                          password=unquote(dsn.password or ""), table_name=a.table,
                          schema_name=a.schema, schema_auto_update=False,
                          include_metadata=False,
                          primary_key_columns=("id",) if a.upsert else (),
                          upsert_on_primary_key=a.upsert)
    app.dataframe(app.topic(a.topic, value_deserializer="json")).sink(sink)
    app.run()


if __name__ == "__main__":
    main()
