"""One consumer group on the three-node cluster: a topic with a backlog, real ``fencectl run``
members, and what is read back from PostgreSQL and Kafka.

Rules
- A group is fresh: its own topic (replication 3, the cluster's default), group and schema;
  records from the seeded reference generator (class ``valid``).
- Members are ``fencectl run`` subprocesses pointed at the cluster (their
  ``KAFKA_BOOTSTRAP_SERVERS``), running ``tests.integration.fault_handlers:counting_handler``
  with a per-batch delay so the backlog lasts through a fault; logs under
  ``artifacts/kafka-faults/<group>/``. ``FENCE_FAULTS_MEMBER_ARGS`` adds flags to every
  member (e.g. ``-X debug=cgrp`` for librdkafka's group log when a scenario fails).
- Classic members use a 20 s session (``CLASSIC_SESSION``), not the suite's 2 s: librdkafka
  drops a classic assignment once the coordinator has not answered for the session timeout
  (its "SESSTMOUT" check), and a coordinator failover takes 10-15 s here. A session
  shorter than the failover makes the group reassign partitions during it (safe, but a
  member whose assignment callback completes late can then fence the new owner, which ends
  with exit 3; docs/kafka-failures.md). KIP-848 sessions are the broker's (6 s, restarted
  when the new coordinator loads the group).
- ``feeding`` keeps producing the rest of the generated records (in order, idempotently, at
  a bounded rate) while a fault runs, so a long fault stays under load however slow the
  machine; the source the oracle folds is what was produced.
- Every wait is bounded and names what it waited for; ``close`` stops every member by pid.
- Exactly once is judged twice: the reference oracle (effects equal the fold of the source
  below the frontiers) and the handler's application counts (``duplicates``: applications
  beyond the first; ``losses``: offsets below the high watermark never applied).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg

from consumer.kafka.source import KafkaSource
from fencing.types import SourceRecord, TopicPartition
from tests.integration.cluster import Cluster
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    durable_rows,
    exactly_once_problems,
    fresh_schema,
    generated,
    produce,
    unique,
    wait_until,
)

__all__ = ["ARTIFACTS", "FaultGroup", "fault_groups"]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "kafka-faults"
HANDLER = ("--handler", "tests.integration.fault_handlers:counting_handler")
CLASSIC_SESSION = ("-X", "session.timeout.ms=20000", "-X", "heartbeat.interval.ms=1000")


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": "0"})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(timeout=60)  # RF: default
    wait_until(lambda: topic in admin.list_topics(timeout=10).topics, timeout_s=60,
               what=f"topic {topic}")


class FaultGroup:
    """A group of members over a backlog on ``cluster`` (see the module Rules)."""

    def __init__(self, services: Any, cluster: Cluster | None, protocol: str, *, name: str,
                 partitions: int = 6, records: int = 6000, batch: int = 20,
                 delay_s: float = 0.1, extra: Sequence[str] = (), feed: int = 0) -> None:
        """``records`` are produced before the members start; ``feed`` more may be produced
        by ``feeding`` while they run. Without ``cluster`` the group runs on the session's
        one-node Kafka (no faults thrown at it)."""
        self.s, self._cluster, self.protocol = services, cluster, protocol
        self.bootstrap = services.kafka_bootstrap if cluster is None else cluster.bootstrap
        self.setup = next(g for g in GROUP_SETUPS if g.name == protocol)
        self.topic, self.group = unique(f"kf_{name}"), unique(f"gkf_{name}")
        self.partitions, self.records_count = partitions, records
        session = CLASSIC_SESSION if "classic" in self.setup.args else ()
        self.flags = ("--batch-max-records", str(batch), *HANDLER, *session, *extra,
                      *shlex.split(os.environ.get("FENCE_FAULTS_MEMBER_ARGS", "")))
        self.env = {"KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
                    "FENCE_TEST_BATCH_DELAY_S": str(delay_s)}
        self.dir = ARTIFACTS / self.group
        self.members: dict[str, WorkerProc] = {}
        self.schema = ""
        self.source: list[SourceRecord] = []
        self.feed_count = feed
        self._generated: list[Any] = []
        self._all: list[SourceRecord] = []

    @property
    def cluster(self) -> Cluster:
        assert self._cluster is not None, "a group on the one-node Kafka has no cluster"
        return self._cluster

    # -- set-up and members -----------------------------------------------------------------
    def prepare(self) -> None:
        _create_topic(self.bootstrap, self.topic, self.partitions)
        self._generated, self._all = generated(
            self.topic, count=self.records_count + self.feed_count, partitions=self.partitions,
            klass="valid", seed=24)
        produce(self.bootstrap, self._generated[:self.records_count])
        self.source = self._all[:self.records_count]
        self.schema = asyncio.run(fresh_schema(self.s.dsn))

    @contextmanager
    def feeding(self, *, rate_per_s: float = 150.0, chunk: int = 30) -> Iterator[None]:
        """Produce the fed records in order while the block runs (see Rules); afterwards
        ``source`` is everything produced."""
        stop = threading.Event()
        done = [self.records_count]

        def feed() -> None:
            while not stop.is_set() and done[0] < len(self._generated):
                nxt = min(done[0] + chunk, len(self._generated))
                produce(self.bootstrap, self._generated[done[0]:nxt])
                done[0] = nxt
                stop.wait(chunk / rate_per_s)

        thread = threading.Thread(target=feed, name="feeder", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=120)
            self.source = self._all[:done[0]]

    def start(self, name: str, *, extra: Sequence[str] = (),
              env: dict[str, str] | None = None) -> WorkerProc:
        w = WorkerProc(topic=self.topic, group=self.group, schema=self.schema, setup=self.setup,
                       extra=(*self.flags, *extra), env={**self.env, **(env or {})}, name=name,
                       log_dir=self.dir)
        self.members[name] = w
        return w

    def start_one_by_one(self, names: Sequence[str], *, extra: Sequence[str] = (),
                         timeout_s: float = 120.0) -> None:
        """Start the members in turn, each once the one before owns partitions. Members that
        join at the same moment can both be handed a partition for a while -- an assignment
        callback still claiming what the group already gave to the newcomer (librdkafka #2079;
        docs/kafka-failures.md) -- and the fence then ends one of them with exit 3: a race of
        the group's formation, not of the faults these scenarios throw."""
        for name in names:
            w = self.start(name, extra=extra)

            def joined(w: WorkerProc = w) -> bool:
                return w.owns_partitions() or not w.alive()
            wait_until(joined, timeout_s=timeout_s, what=f"member {name} owning partitions")

    def exited(self) -> dict[str, int]:
        """Members that ended by themselves: name -> exit code."""
        return {n: w.proc.returncode for n, w in self.members.items() if not w.alive()}

    def stop_all(self, timeout_s: float = 60.0) -> dict[str, int]:
        """SIGTERM every live member; their exit codes."""
        live = {n: w for n, w in self.members.items() if w.alive()}
        for w in live.values():
            w.terminate()
        return {n: w.wait(timeout_s) for n, w in live.items()}

    def close(self) -> None:
        """Stop every member by pid, then delete the topic (a node restarts faster with
        fewer partitions to load and catch up)."""
        for w in self.members.values():
            w.ensure_dead()
        if self.schema:
            from confluent_kafka.admin import AdminClient

            admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": "0"})
            try:
                admin.delete_topics([self.topic])[self.topic].result(timeout=30)
            except Exception as exc:  # best effort: the next test does not need it gone
                print(f"deleting {self.topic}: {exc}")

    # -- reads ------------------------------------------------------------------------------
    def frontiers(self) -> dict[int, int]:
        rows = asyncio.run(durable_rows(self.s.dsn, self.schema, self.group, self.topic))
        return {p: f for p, (_e, f) in rows.items()}

    def committed(self) -> int:
        return sum(self.frontiers().values())

    def high_watermarks(self) -> dict[int, int]:
        facts = KafkaSource({"bootstrap.servers": self.bootstrap}).facts(
            [TopicPartition(self.topic, p) for p in range(self.partitions)])
        return {tp.partition: f.high_watermark for tp, f in facts.items()}

    def wait_committing(self, *, timeout_s: float = 120.0) -> None:
        """Every member owns partitions and the group committed something, with most of the
        backlog still ahead (so a fault lands under load) unless records are fed."""
        wait_until(lambda: all(w.owns_partitions() for w in self.members.values())
                   and self.committed() > 0, timeout_s=timeout_s,
                   what="every member owning partitions and a first commit")
        done = self.committed()
        assert self.feed_count or done < self.records_count // 2, (
            f"{done} of {self.records_count} records were processed before the fault: the "
            "backlog is too short to put the fault under load")

    def drained(self) -> bool:
        return self.frontiers() == {p: n for p, n in self._ends().items()}

    def _ends(self) -> dict[int, int]:
        ends: dict[int, int] = {}
        for r in self.source:
            ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
        return ends

    def wait_drained(self, *, since: float, timeout_s: float = 240.0) -> float:
        """Seconds from ``since`` (monotonic) until every frontier is at the end of the
        backlog; fails early when a member exits."""
        def check() -> bool:
            gone = self.exited()
            assert not gone, f"members exited while draining: {gone}\n{self.tails(gone)}"
            return self.drained()
        wait_until(check, timeout_s=timeout_s, what="the group draining its backlog",
                   interval_s=0.5)
        return round(time.monotonic() - since, 1)

    def applied_offsets(self) -> set[tuple[int, int]]:
        """(partition, offset) of every record applied so far."""
        return {(r["partition"], r["offset"]) for r in self._applied()}

    def _applied(self) -> list[Any]:
        async def read() -> list[Any]:
            conn = await asyncpg.connect(self.s.dsn)
            try:
                return list(await conn.fetch(
                    f'SELECT partition, "offset", n FROM "{self.schema}".applied '
                    "WHERE topic = $1", self.topic))
            finally:
                await conn.close()
        return asyncio.run(read())

    def applications(self) -> tuple[int, int]:
        """(duplicates, losses) from the handler's counts (see Rules)."""
        rows = self._applied()
        dup = sum(r["n"] - 1 for r in rows if r["n"] > 1)
        seen = {(r["partition"], r["offset"]) for r in rows}
        lost = sum(1 for r in self.source if (r.partition, r.offset) not in seen)
        return dup, lost

    def oracle(self) -> list[str]:
        return asyncio.run(exactly_once_problems(self.s.dsn, self.schema, self.group,
                                                 self.topic, self.source))

    def kafka_lags(self) -> dict[int, int | None]:
        """partition -> lag by Kafka's own ``kafka-consumer-groups --describe``."""
        return {r.partition: r.lag for r in self.cluster.lags(self.group)
                if r.topic == self.topic}

    def wait_kafka_lag_zero(self, *, timeout_s: float = 90.0) -> dict[int, int | None]:
        lags: dict[int, int | None] = {}

        def zero() -> bool:
            nonlocal lags
            lags = self.kafka_lags()
            return len(lags) == self.partitions and all(v == 0 for v in lags.values())
        try:
            wait_until(zero, timeout_s=timeout_s, what="Kafka's consumer-groups tool showing "
                       "lag 0 on every partition", interval_s=2.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: last {lags}") from None
        return lags

    def tails(self, names: Sequence[str] | dict[str, int], lines: int = 30) -> str:
        return "\n".join(f"--- {n}:\n" + "\n".join(self.members[n].log().splitlines()[-lines:])
                         for n in names)


@contextmanager
def fault_groups(services: Any, cluster: Cluster | None
                 ) -> Iterator[Callable[..., FaultGroup]]:
    """Makes ``FaultGroup``s (on ``cluster``, or the session's one-node Kafka when None) and
    closes every one it made afterwards, its members stopped by pid."""
    made: list[FaultGroup] = []

    def make(name: str, protocol: str, **kwargs: Any) -> FaultGroup:
        g = FaultGroup(services, cluster, protocol, name=name, **kwargs)
        made.append(g)
        return g

    try:
        yield make
    finally:
        for g in made:
            g.close()
