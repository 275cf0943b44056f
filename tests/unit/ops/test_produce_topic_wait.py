"""``ensure_topic`` after creating a topic waits until the broker's metadata lists its
partitions with leaders. Kafka documents that metadata may lag a successful CreateTopics
for seconds (``Admin.createTopics`` javadoc); on a broker started seconds earlier the first
answer listed 0 partitions and ``make bench`` stopped with "has 0 partitions". The admin
here replays that documented lag (the real broker's behaviour is exercised by every
integration test that produces to a new topic)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from ops.commands import produce
from ops.commands.produce import ProduceOptions, ensure_topic


class LaggingAdmin:
    """Creates the topic at once; its metadata shows the partitions only after ``lag`` more
    ``list_topics`` calls, the first of them without leaders."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.created = False
        self.calls = 0

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> Any:
        if not self.created:
            return SimpleNamespace(topics={})
        self.calls += 1
        if self.calls < self.lag:
            parts: dict[int, Any] = {}
        else:
            leader = -1 if self.calls == self.lag else 1
            parts = {p: SimpleNamespace(leader=leader) for p in range(6)}
        return SimpleNamespace(topics={"t": SimpleNamespace(error=None, partitions=parts)})

    def create_topics(self, topics: list[Any]) -> dict[str, Future[None]]:
        self.created = True
        done: Future[None] = Future()
        done.set_result(None)
        return {"t": done}


def test_a_new_topic_is_awaited_until_its_partitions_have_leaders() -> None:
    admin = LaggingAdmin(lag=4)
    opts = ProduceOptions(topic="t", count=1, seed=1, klass="valid", partitions=6)
    assert ensure_topic(admin, opts) is None  # type: ignore[arg-type]
    assert admin.calls == 5  # 3 without partitions, 1 without leaders, then ready


def test_metadata_that_never_catches_up_is_reported_with_the_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = LaggingAdmin(lag=10**9)
    opts = ProduceOptions(topic="t", count=1, seed=1, klass="valid", partitions=6)
    original = produce._await_partitions
    monkeypatch.setattr(produce, "_await_partitions",
                        lambda a, t, n: original(a, t, n, timeout_s=0.3))
    got = ensure_topic(admin, opts)  # type: ignore[arg-type]
    assert got == "--topic t has 0 partitions; --partitions 6 needs at least that many"
