"""``ops.bench.profile.rank``: own and inclusive samples, and the split of the worker's
samples into its parts, from py-spy's raw (collapsed) stacks."""

from __future__ import annotations

from ops.bench.profile import per_record_us, rank

RAW = "\n".join([
    "main (ops/cli.py:4);handle (ops/reference/pg.py:150);_do_execute (asyncpg/connection.py:9) 6",
    "main (ops/cli.py:4);_process (consumer/lifecycle.py:3);timed (ops/bench/clock.py:93) 2",
    "KafkaThread._main (consumer/kafka/adapter.py:224) 3",
    "LifetimeRun._take_delivery (consumer/lifetime_run.py:270);"
    "to_record (consumer/kafka/adapter.py:120) 2",
    "main (ops/cli.py:4);_process (consumer/lifecycle.py:3);write (asyncio/selector_events.py:1) 4",
    "main (ops/cli.py:4);select (selectors.py:468) 3",
    "not a stack line",
])


def test_rank_counts_own_inclusive_and_parts() -> None:
    r = rank(RAW)
    assert r["samples"] == 20
    own = {x["function"]: x["samples"] for x in r["own"]}
    assert own["asyncpg/connection.py:_do_execute"] == 6
    inclusive = {x["function"]: x["samples"] for x in r["inclusive"]}
    assert inclusive["ops/cli.py:main"] == 15 and inclusive["consumer/lifecycle.py:_process"] == 6
    assert r["parts"] == {
        "handler": 0.4,  # the handler's own frames and what it calls, under the lifecycle too
        "worker frame outside the handler (lifecycle, fence, spans, metrics)": 0.2,
        "kafka thread (consume() and hand-over)": 0.15,
        "other": 0.15,
        "delivery on the loop (translate, buffer)": 0.1,
    }


def test_per_record_us_turns_part_shares_into_sampled_microseconds_per_record() -> None:
    # 2,000 samples at 200/s = 10 s sampled over 400,000 records = 25 us per record in all
    got = per_record_us({"handler": 0.72, "other": 0.28}, samples=2_000, rate=200,
                        records=400_000)
    assert got == {"handler": 18.0, "other": 7.0}
    assert per_record_us({"other": 1.0}, samples=10, rate=100, records=0) == {"other": 1e5}
