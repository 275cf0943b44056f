"""Several topics per worker: a repeated ``--topic`` and a ``--topic-pattern`` together,
against real Kafka and PostgreSQL.

A worker subscribed to one named topic and a pattern consumes the named topic and the
matching topic that exists at start; a matching topic created while it runs is picked up
(``-X topic.metadata.refresh.interval.ms=1000``: librdkafka re-matches the ``^`` regex
only on that periodic refresh, default 5 min; ``metadata.max.age.ms`` does not do it,
librdkafka #2361) and its records are applied exactly once (reference oracle per topic);
a topic that does not match is left alone. Metrics (``/metrics``) and ``fencectl status``
report each topic. A ``--topic`` that does not exist is refused at start (exit 2) naming it.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from ops.stack.config import ServiceSettings
from tests.integration.observability_support import (
    free_port,
    http_get,
    metric,
    run_fencectl,
    start_worker,
)
from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    committed_total,
    create_topic,
    durable_rows,
    exactly_once_problems,
    fresh_schema,
    generated,
    produce,
    unique,
)
from tests.polling import wait_until

pytestmark = pytest.mark.integration

COUNT = 60


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda g: g.name)
def test_pattern_picks_up_a_topic_created_while_running(services: ServiceSettings,
                                                        setup: GroupSetup) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    prefix, group = unique("mt"), unique("g-mt")
    named, first, later, other = (f"{prefix}-named", f"{prefix}-p1", f"{prefix}-p2",
                                  f"{prefix}-x1")
    schema = asyncio.run(fresh_schema(dsn))
    sources = {}
    for topic in (named, first, other):
        create_topic(bootstrap, topic, 2)
        recs, sources[topic] = generated(topic, count=COUNT, partitions=2)
        produce(bootstrap, recs)
    port = free_port()
    w = start_worker(topic=named, group=group, schema=schema, setup=setup, http_port=port,
                     extra=("--topic-pattern", f"{prefix}-p[0-9]+",
                            "-X", "topic.metadata.refresh.interval.ms=1000"))
    try:
        wait_until(lambda: all(committed_total(dsn, schema, group, t) == COUNT
                               for t in (named, first)),
                   timeout_s=60, what=f"{named} and {first} applied")
        create_topic(bootstrap, later, 3)
        recs, sources[later] = generated(later, count=COUNT, partitions=3, seed=9)
        produce(bootstrap, recs)
        wait_until(lambda: committed_total(dsn, schema, group, later) == COUNT,
                   timeout_s=60, what=f"{later}, created while running, applied")
        assert w.alive(), w.log()[-3000:]
        assert f"matches 1 topic(s) now: {first}" in w.log()  # `other` does not match
        # the counter moves when the COMMIT's reply reaches the worker, a moment after
        # PostgreSQL shows the frontier: wait for it (a read right away may be early)
        wait_until(lambda: (got := http_get(f"http://127.0.0.1:{port}/metrics")) is not None
                   and got[0] == 200 and all(
                       metric(got[1], "fence_records_processed_total", topic=t) == COUNT
                       for t in (named, first, later)),
                   timeout_s=30, what="every record counted per topic")
        status = run_fencectl("status", "--json", "--group", group, "--schema", schema)
        assert status.returncode == 0, status.stderr
        totals = {t["topic"]: t for t in json.loads(status.stdout)["topics"]}
        assert set(totals) == {named, first, later}
        assert [totals[t]["partitions"] for t in (named, first, later)] == [2, 2, 3]
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
    for topic in (named, first, later):
        problems = asyncio.run(exactly_once_problems(dsn, schema, group, topic,
                                                     sources[topic]))
        assert problems == [], (topic, problems)
    assert asyncio.run(durable_rows(dsn, schema, group, other)) == {}  # no match: untouched


def test_a_missing_named_topic_is_refused_naming_it(services: ServiceSettings) -> None:
    present, missing = unique("mt-here"), unique("mt-missing")
    create_topic(services.kafka_bootstrap, present, 1)
    schema = asyncio.run(fresh_schema(services.dsn))
    done = run_fencectl("run", "--topic", present, "--topic", missing, "--group",
                        unique("g-mt"), "--schema", schema)
    assert done.returncode == 2
    assert f"fencectl run: --topic {missing}: topic '{missing}' does not exist" in done.stderr
    assert "Traceback" not in done.stderr
