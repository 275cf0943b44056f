"""Seeded schedule generator: one ``random.Random(seed)`` draws the config, the source and
the steps. The generator keeps a rough model (who holds and has sought what) only to make
useful schedules; correctness never depends on it, the runner decides everything.

Rules
- Pure in (seed, class, steps): the same arguments give the same trace.
- Offsets have gaps (compaction, transaction markers): a record may follow its
  predecessor by 1 to 3 offsets.
- The call budget is the production 20 s, or 400 ms in one run of four so that logical
  delays and retry waits can exhaust it.
- Faults are attached to assign, seek and process steps with legal choices only;
  interleaves reserve fresh replacement ids.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from fencing.memory.faults import Fault, FaultOutcome, Interleave, Operation
from fencing.types import SourceRecord
from ops.reference.generate import generate
from ops.sim.trace import SimConfig, Step, Trace, toolchain

__all__ = ["DEFAULT_STEPS", "make_trace"]

DEFAULT_STEPS = 64
_OPS = {"assign": (Operation.VALIDATE, Operation.CLAIM, Operation.CLAIM, Operation.OBSERVE),
        "seek": (Operation.OBSERVE,),
        "process": (Operation.PROCESS, Operation.PROCESS, Operation.OBSERVE)}


@dataclass(slots=True)
class _Model:
    rng: random.Random
    partitions: int
    next_id: int = 1
    live: list[int] = field(default_factory=list)
    holder: dict[int, int] = field(default_factory=dict)  # partition -> worker
    sought: set[tuple[int, int]] = field(default_factory=set)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def _records(rng: random.Random, seed: int, klass: str, partitions: int,
             topic: str) -> tuple[SourceRecord, ...]:
    count = rng.randint(16, 40)
    next_off = [0] * partitions
    out: list[SourceRecord] = []
    for g in generate(seed, count=count, partitions=partitions, klass=klass,  # type: ignore[arg-type]
                      topic=topic):
        off = next_off[g.partition]
        out.append(SourceRecord(topic, g.partition, off, g.key, g.value))
        next_off[g.partition] = off + rng.choice((1, 1, 1, 2, 3))
    return tuple(out)


def _fault(m: _Model, actor: str, taken: set[tuple[Operation, int]]) -> Fault | None:
    rng = m.rng
    op = rng.choice(_OPS[actor])
    call = rng.choice((1, 1, 1, 2, 2, 3))
    wants_interleave = op.mutating and rng.random() < 0.35
    if wants_interleave:
        call = 1  # reached whenever the step reaches its first mutating call
    if (op, call) in taken:
        return None
    taken.add((op, call))
    if op.mutating:
        outcome = rng.choice(tuple(FaultOutcome))
    else:
        outcome = rng.choice((FaultOutcome.ABORT, FaultOutcome.ABORT, FaultOutcome.COMMIT))
    delay_ms = rng.choice((0, 0, 0, 5, 50, 250))
    interleave = None
    if wants_interleave:
        stop = rng.random() < 0.5
        replacement = m.new_id() if (not stop or rng.random() < 0.7) else None
        interleave = Interleave(rng.choice(("before", "after")), stop, replacement)
    return Fault(op, call, outcome, delay_ms, interleave)


def _faults(m: _Model, actor: str) -> tuple[Fault, ...]:
    if m.rng.random() >= 0.3:
        return ()
    taken: set[tuple[Operation, int]] = set()
    faults = [f for f in (_fault(m, actor, taken) for _ in range(m.rng.choice((1, 1, 2))))
              if f is not None]
    return tuple(faults)


def _apply_interleaves(m: _Model, worker: int, partition: int, faults: tuple[Fault, ...]) -> None:
    for f in faults:
        if f.interleave is None:
            continue
        if f.interleave.stop and worker in m.live:
            m.live.remove(worker)
        if f.interleave.replacement is not None:
            m.live.append(f.interleave.replacement)
            m.holder[partition] = f.interleave.replacement
            m.sought.add((f.interleave.replacement, partition))


def _next_step(m: _Model) -> list[Step]:
    rng = m.rng
    if not m.live or rng.random() < 0.04:
        w = m.new_id()
        m.live.append(w)
        return [Step("start", w)]
    r = rng.random()
    w = rng.choice(m.live)
    p = rng.randrange(m.partitions)
    if r < 0.05:
        m.live.remove(w)
        return [Step("stop", w)]
    if r < 0.10:  # a stray call: a zombie, or a late seek/process after revoke
        actor = rng.choice(("seek", "process"))
        return [Step(actor, w, p, _faults(m, actor))]
    held = sorted((hp, hw) for hp, hw in m.holder.items() if hw in m.live)
    ready = [(hw, hp) for hp, hw in held if (hw, hp) in m.sought]
    if r < 0.55 and ready:
        w, p = rng.choice(ready)
        faults = _faults(m, "process")
        _apply_interleaves(m, w, p, faults)
        return [Step("process", w, p, faults)]
    if r < 0.68 and held:
        hp, hw = rng.choice(held)
        if (hw, hp) not in m.sought:
            m.sought.add((hw, hp))
            return [Step("seek", hw, hp, _faults(m, "seek"))]
    if r < 0.76 and held:
        hp, hw = rng.choice(held)
        m.holder.pop(hp, None)
        m.sought.discard((hw, hp))
        return [Step("revoke", hw, hp)]
    steps: list[Step] = []
    old = m.holder.get(p)
    if old is not None and old != w and old in m.live and rng.random() < 0.7:
        steps.append(Step("revoke", old, p))
    faults = _faults(m, "assign")
    m.holder[p] = w
    m.sought.discard((w, p))
    steps.append(Step("assign", w, p, faults))
    _apply_interleaves(m, w, p, faults)
    return steps


def make_trace(seed: int, *, klass: str = "valid", steps: int = DEFAULT_STEPS,
               drain: bool = True) -> Trace:
    """The trace of ``seed``: config, source records and ``steps`` steps."""
    if klass not in ("valid", "conflict"):
        raise ValueError(f"class {klass!r}: expected valid or conflict")
    rng = random.Random(f"worker-schedule-v1/{seed}/{klass}")
    partitions = rng.choice((1, 2, 2, 3))
    config = SimConfig(klass=klass, steps=steps, topic="sim", partitions=partitions,
                       group_id="sim", batch_max=rng.randint(1, 4),
                       budget_ms=rng.choice((20_000, 20_000, 20_000, 400)),
                       low_watermarks_before_drain=(0,) * partitions,
                       allow_retention_gap=False)
    records = _records(rng, seed, klass, partitions, config.topic)
    model = _Model(rng, partitions)
    out: list[Step] = []
    while len(out) < steps:
        out.extend(_next_step(model))
    return Trace(seed=seed, config=config, records=records, steps=tuple(out[:steps]),
                 drain=drain, toolchain=toolchain())
