"""Seeded, swarm-style schedule generator: one ``random.Random`` per (seed, class) draws a
profile (``ops.sim.swarm``), the config, the source and the steps.

Rules
- Pure in (seed, class, steps): the same arguments give the same trace.
- Steps are chosen against the real state: the generator runs each step it emits through
  the production lifecycle (``ops.sim.runner``, same logical time) and aims the next one at
  live lifetimes, held tokens, sought partitions with records left, and takeovers. What the
  trace records is only the steps; replay never regenerates (``ops.sim.trace``).
- A small, profile-weighted share of steps is deliberately stray: a late seek/process by a
  lifetime whose token was revoked or taken over (a zombie). No other step is chosen when it
  cannot reach the store.
- Offsets have gaps (compaction, transaction markers): a record may follow its
  predecessor by 1 to 3 offsets.
- Faults are legal choices only; interleaves reserve fresh replacement ids. Assign, revoke
  and takeover steps may carry a set of partitions (one lifecycle call), so faults and
  replacements apply to a multi-partition claim; a process step may carry a set of the
  lifetime's ready partitions (several batches in flight). Heartbeats aim at lifetimes
  whose heartbeat still writes; retention (``expire``) only at claimed partitions that
  still owe records, to just past their durable frontier or further. Version 4: a seek may
  carry a set of one lifetime's unsought partitions (one observe); ``lost`` aims at a live
  lifetime's held partitions; a process call's interleave may queue the next batch and
  lose the step's partitions; one profile in three gives the handler poison records and
  transient failures (``ops.sim.failures``). Version 5: a profile with lanes
  (``ops.sim.swarm.draw_lanes``) runs every partition in lanes (``ops.sim.lanes``); its
  process steps carry lane and fold faults instead of process and attempt faults, an eager
  revoke of a set rides a lane call, and no ``lost`` interleave is drawn (it rides a process
  call). Its trace is version 5; every other trace is version 4.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from consumer.decisions import LifetimeState
from fencing.memory.faults import Fault, Interleave, Operation
from fencing.types import SourceRecord
from ops.reference.generate import generate
from ops.sim.runner import finish, new_run, run_sync
from ops.sim.swarm import LanesProfile, Profile, draw_lanes, draw_profile
from ops.sim.trace import SimConfig, Step, Trace, toolchain

__all__ = ["DEFAULT_STEPS", "generate_and_run", "make_trace"]

DEFAULT_STEPS = 64


def _records(rng: random.Random, seed: int, klass: str, partitions: int, topic: str,
             count: int) -> tuple[SourceRecord, ...]:
    next_off = [0] * partitions
    out: list[SourceRecord] = []
    for g in generate(seed, count=count, partitions=partitions, klass=klass,  # type: ignore[arg-type]
                      topic=topic):
        off = next_off[g.partition]
        out.append(SourceRecord(topic, g.partition, off, g.key, g.value))
        next_off[g.partition] = off + rng.choice((1, 1, 1, 2, 3))
    return tuple(out)


@dataclass(slots=True)
class _Gen:
    rng: random.Random
    profile: Profile
    run: object  # ops.sim.runner._Run
    partitions: int
    next_id: int = 1
    lanes: LanesProfile | None = None
    steps: list[Step] = field(default_factory=list)
    kinds: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # per actor

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def _fault_list(g: _Gen, actor: str) -> tuple[Fault, ...]:
    rng, prof = g.rng, g.profile
    kinds = g.kinds.get(actor)
    if kinds is None:
        kinds = g.kinds[actor] = prof.kinds_of(actor)
    if not kinds or rng.random() >= prof.fault_rate:
        return ()
    taken: dict[tuple[Operation, int], Fault] = {}
    for _ in range(rng.randint(1, prof.max_faults)):
        op, outcome = rng.choice(kinds)
        burst = rng.random() < prof.burst_rate
        calls = range(1, rng.randint(2, 3) + 1) if burst else (rng.choice((1, 1, 2, 3)),)
        for call in calls:
            if (op, call) in taken:
                continue
            interleave = None
            if op.interleavable and call == 1 and rng.random() < prof.interleave_rate:
                revoke = (actor == "process" and op in (Operation.PROCESS, Operation.LANE)
                          and rng.random() < prof.revoke_rate)
                lost = (actor == "process" and op is Operation.PROCESS and not revoke
                        and rng.random() < prof.lost_rate)
                stop = rng.random() < (0.1 if lost else 0.4)
                replacement = g.new_id() if (not stop and not revoke and not lost) or \
                    rng.random() < (0.3 if lost else 0.5) else None
                at = rng.choice(("before", "after")) if op.has_after_point else "before"
                interleave = Interleave(at, stop, replacement, revoke, lost)
            taken[(op, call)] = Fault(op, call, outcome, rng.choice(prof.delays), interleave)
    return tuple(taken[k] for k in sorted(taken, key=lambda k: (k[0].value, k[1])))


def _state(g: _Gen) -> tuple[list[int], dict[int, list[int]], list[tuple[int, int]]]:
    """Live lifetimes, partitions each one holds a token for, and processable pairs."""
    run = g.run
    live = sorted(w for w, lc in run.lifecycles.items()  # type: ignore[attr-defined]
                  if lc.state is LifetimeState.LIVE)
    held: dict[int, list[int]] = {}
    ready: list[tuple[int, int]] = []
    for w in live:
        lc = run.lifecycles[w]  # type: ignore[attr-defined]
        held[w] = [p for p in range(g.partitions) if lc.token(run.tp(p)) is not None]  # type: ignore[attr-defined]
        ready.extend((w, p) for p in held[w] if run.ready(w, p))  # type: ignore[attr-defined]
    return live, held, ready


def _some(g: _Gen, ps: list[int]) -> int | tuple[int, ...]:
    """One partition of ``ps``, or (profile permitting) a sorted set of them."""
    if len(ps) > 1 and g.rng.random() < g.profile.multi_rate:
        chosen = tuple(sorted(g.rng.sample(ps, g.rng.randint(2, len(ps)))))
        return chosen
    return g.rng.choice(ps)


def _owing(g: _Gen) -> list[tuple[int, int]]:
    """Claimed partitions whose durable frontier is below the end and Kafka's low
    watermark (where retention can still delete records the group owes)."""
    run = g.run
    out = []
    for p in range(g.partitions):
        token = run.store.token_of(run.tp(p))  # type: ignore[attr-defined]
        if token is not None and max(token.frontier, run.lows[p]) < run.ends[p]:  # type: ignore[attr-defined]
            out.append((p, max(token.frontier, run.lows[p])))  # type: ignore[attr-defined]
    return out


def _queueable(g: _Gen, w: int, ps: int | tuple[int, ...]) -> bool:
    """True when a partition of ``ps`` has more than one batch left for ``w``."""
    run = g.run
    for p in ps if isinstance(ps, tuple) else (ps,):
        cursor = run.cursors.get((w, p), 0)  # type: ignore[attr-defined]
        left = [r for r in run.by_partition[p] if r.offset >= cursor]  # type: ignore[attr-defined]
        if len(left) > run.trace.config.batch_max:  # type: ignore[attr-defined]
            return True
    return False


def _late(g: _Gen, live: list[int], held: dict[int, list[int]]) -> list[Step] | None:
    """A late call: a live lifetime's seek/process of a partition it no longer holds."""
    run = g.run
    pairs = [(w, p) for (w, p) in sorted(run.cursors)  # type: ignore[attr-defined]
             if w in live and p not in held[w]]
    if not pairs:
        return None
    w, p = g.rng.choice(pairs)
    return [Step(g.rng.choice(("seek", "process", "process")), w, p)]


def _next(g: _Gen) -> list[Step]:
    rng, prof = g.rng, g.profile
    live, held, ready = _state(g)
    if not live or (len(live) < 4 and rng.random() < prof.weight("start")):
        return [Step("start", g.new_id())]
    holder = {p: w for w in live for p in held[w]}
    options: list[tuple[str, float]] = []
    if ready:
        options.append(("process", prof.weight("process")))
    unsought = [(w, p) for w in live for p in held[w] if (w, p) not in g.run.cursors]  # type: ignore[attr-defined]
    if unsought:
        options.append(("seek", prof.weight("seek")))
    if any(held.values()):
        options.append(("revoke", prof.weight("revoke")))
        options.append(("reseek", prof.weight("seek") / 4))
    free = [(w, p) for w in live for p in range(g.partitions) if p not in holder]
    if free:
        options.append(("assign", prof.weight("assign")))
    if len(live) > 1 and holder:
        options.append(("takeover", prof.weight("takeover")))
    if len(live) > 1:
        options.append(("stop", prof.weight("stop")))
    if any(held.values()) and prof.weight("lost"):
        options.append(("lost", prof.weight("lost")))
    options.append(("late", prof.weight("late")))
    beats = g.run.heartbeats  # type: ignore[attr-defined]
    if any(beats.writes_more(w, lc) for w, lc in g.run.lifecycles.items()):  # type: ignore[attr-defined]
        options.append(("heartbeat", prof.weight("heartbeat")))
    owing = _owing(g) if prof.weight("expire") else []
    if owing:
        options.append(("expire", prof.weight("expire")))
    kind = rng.choices([o for o, _ in options], weights=[w for _, w in options])[0]
    if kind == "process":
        w, p = rng.choice(ready)
        ps = _some(g, [q for x, q in ready if x == w])
        faults = _fault_list(g, "process")
        call = Operation.LANE if g.lanes is not None else Operation.PROCESS
        if isinstance(ps, tuple) and rng.random() < prof.revoke_rate / 2 and not any(
                f.operation is call and f.call == 1 for f in faults):
            # an eager revoke of the whole set while its batches are in flight
            revoke = Interleave(rng.choice(("before", "after")), revoke=True)
            faults = (*faults, Fault(call, 1, interleave=revoke))
            faults = tuple(sorted(faults, key=lambda f: (f.operation.value, f.call)))
        elif g.lanes is None and rng.random() < prof.lost_rate / 6 and _queueable(
                g, w, ps) and not any(
                f.operation is Operation.PROCESS and f.call == 1 for f in faults):
            # the next batch queues behind the guard, then the session is lost
            lost = Interleave(rng.choice(("before", "after")), lost=True)
            faults = (*faults, Fault(Operation.PROCESS, 1, interleave=lost))
            faults = tuple(sorted(faults, key=lambda f: (f.operation.value, f.call)))
        return [Step("process", w, ps, faults)]
    if kind == "heartbeat":
        beating = [w for w, lc in sorted(g.run.lifecycles.items())  # type: ignore[attr-defined]
                   if beats.writes_more(w, lc)]
        return [Step("heartbeat", rng.choice(beating), None, _fault_list(g, "heartbeat"))]
    if kind == "expire":
        p, frontier = rng.choice(owing)
        return [Step("expire", 0, p, offset=rng.randint(frontier + 1, g.run.ends[p]))]  # type: ignore[attr-defined]
    if kind == "seek":  # one partition, or a set of one lifetime's (one observe)
        w, _ = rng.choice(unsought)
        return [Step("seek", w, _some(g, [q for x, q in unsought if x == w]),
                     _fault_list(g, "seek"))]
    if kind == "lost":
        w = rng.choice([w for w in live if held[w]])
        return [Step("lost", w, _some(g, held[w]))]
    if kind == "revoke":
        w = rng.choice([w for w in live if held[w]])
        return [Step("revoke", w, _some(g, held[w]), _fault_list(g, "revoke"))]
    if kind == "reseek":
        w, p = rng.choice([(w, p) for w in live for p in held[w]])
        return [Step("seek", w, p, _fault_list(g, "seek"))]
    if kind == "assign":
        w = rng.choice(sorted({w for w, _ in free}))
        return [Step("assign", w, _some(g, [p for x, p in free if x == w]),
                     _fault_list(g, "assign"))]
    if kind == "takeover":
        w = rng.choice(live)
        taken = _some(g, [p for p in sorted(holder) if holder[p] != w] or sorted(holder))
        ps = taken if isinstance(taken, tuple) else (taken,)
        out: list[Step] = []
        for old in sorted({holder[p] for p in ps if holder[p] != w}):
            if rng.random() < prof.revoke_first:
                mine = tuple(p for p in ps if holder[p] == old)
                out.append(Step("revoke", old, mine if len(mine) > 1 else mine[0]))
        return [*out, Step("assign", w, taken, _fault_list(g, "assign"))]
    if kind == "stop":
        return [Step("stop", rng.choice(live))]
    return _late(g, live, held) or [Step("start", g.new_id())]


async def _generate(g: _Gen, steps: int) -> None:
    while len(g.steps) < steps:
        for step in _next(g):
            if len(g.steps) >= steps:
                return
            g.steps.append(step)
            await g.run.step(step)  # type: ignore[attr-defined]


def _start(seed: int, klass: str, steps: int, checking: bool) -> tuple[_Gen, Trace]:
    if klass not in ("valid", "conflict"):
        raise ValueError(f"class {klass!r}: expected valid or conflict")
    rng = random.Random(f"worker-schedule-v1/swarm/{seed}/{klass}")
    prof = draw_profile(rng)
    partitions = prof.partitions
    records = _records(rng, seed, klass, partitions, "sim", prof.records)
    ends = {p: max([r.offset + 1 for r in records if r.partition == p], default=0)
            for p in range(partitions)}
    lows = tuple(rng.randint(1, ends[p]) if prof.retention and ends[p] else 0
                 for p in range(partitions))
    poison: tuple[tuple[int, int], ...] = ()
    transient: tuple[tuple[int, int, int], ...] = ()
    if prof.failures and records:  # a few poison records and a few transient ones
        chosen = rng.sample(records, min(len(records), rng.randint(1, 5)))
        cut = rng.randint(0, len(chosen))
        poison = tuple(sorted((r.partition, r.offset) for r in chosen[:cut]))
        drawn = [(r.partition, r.offset, rng.randint(1, 2)) for r in chosen[cut:]]
        # at most two transient failures in the run: with the batch's attempts counted at
        # one key they never exhaust POLICY's four (past it a record is poison by design)
        kept = [x for i, x in enumerate(drawn) if sum(n for *_, n in drawn[:i + 1]) <= 2]
        transient = tuple(sorted(kept))
    lanes = draw_lanes(seed, klass, failures=prof.failures)
    config = SimConfig(klass=klass, steps=steps, topic="sim", partitions=partitions,
                       group_id="sim", batch_max=prof.batch_max, budget_ms=prof.budget_ms,
                       low_watermarks_before_drain=lows, allow_retention_gap=prof.retention,
                       topic_recreated_before_drain=prof.recreated, poison=poison,
                       transient=transient, **({} if lanes is None else {
                           "lanes": lanes.lanes, "lanes_window": lanes.window,
                           "fold_every": lanes.fold_every}))
    shell = Trace(seed=seed, config=config, records=records, steps=(), drain=False,
                  toolchain=toolchain(), version=4 if lanes is None else 5)
    g = _Gen(rng, prof, new_run(shell, checking=checking), partitions, lanes=lanes)
    if lanes is not None:  # lane and fold faults instead of process and attempt faults
        g.kinds["process"] = (*(k for k in prof.kinds_of("process")
                                if k[0] not in (Operation.PROCESS, Operation.ATTEMPT)),
                              *lanes.kinds)
    return g, shell


def make_trace(seed: int, *, klass: str = "valid", steps: int = DEFAULT_STEPS,
               drain: bool = True) -> Trace:
    """The trace of ``seed``: config, source records and ``steps`` steps."""
    g, shell = _start(seed, klass, steps, checking=False)
    run_sync(_generate(g, steps), clock=g.run.clock)  # type: ignore[attr-defined]
    return replace(shell, steps=tuple(g.steps), drain=drain)


def generate_and_run(seed: int, *, klass: str = "valid", steps: int = DEFAULT_STEPS,
                     drain: bool = True) -> tuple[Trace, dict[str, Any]]:
    """``make_trace`` and the report of that trace from the very run that chose its steps
    (checked as it goes): one pass instead of two, for sweeps. The corpus replays instead
    and checks that both paths give the same report."""
    g, shell = _start(seed, klass, steps, checking=True)

    async def go() -> tuple[Trace, dict[str, Any]]:
        await _generate(g, steps)
        trace = replace(shell, steps=tuple(g.steps), drain=drain)
        return trace, await finish(g.run, trace)  # type: ignore[arg-type]

    return run_sync(go(), clock=g.run.clock)  # type: ignore[attr-defined]
