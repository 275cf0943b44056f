"""Mutation score of the simulator: named rule mutations of the production lifecycle,
guarded calls, resolution and memory store, each applied in process (attribute patches,
restored afterwards), and which randomized runs kill each one.

Long because every mutant is a small, reviewed replacement of one production rule, kept
next to its name so the table reads against the code.

Rules
- A mutant is killed by a run when the run is not a strict PASS (any status other than
  PASS, or a nondeterministic pair of runs for the corpus). Named tests are not used.
- Evidence per mutant: the 20-run corpus (``ops.sim.corpus``) and the sweep of seeds
  1..N x both classes; the sweep stops at the first kill (the smallest killing seed is
  reported, whatever the number of processes).
- Every mutant is pinned to its first killing sweep run (``FIRST_KILLS``), checked by a
  fast test in ``make test``; the sweep table reports a pin the generator has moved.
- ``patched`` restores every attribute even when the run raises; the healthy code is
  never left mutated.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import consumer.decisions
import consumer.lifecycle
import consumer.lifetime_gate
import fencing.failures
import fencing.guarded
import fencing.lanes
import fencing.memory.store
from fencing.errors import NotCommitted, OutcomeUnknown
from fencing.policy import with_policy
from fencing.resolution import Resolution
from fencing.types import Token
from ops.sim.corpus import CLASSES, CORPUS_SEEDS, run_one
from ops.sim.reduce import failure_of

__all__ = ["FIRST_KILLS", "MUTANTS", "Mutant", "kill_table", "patched", "render_table",
           "runs_up_to"]

Patch = tuple[object, str, object]


@contextmanager
def patched(patches: Sequence[Patch]) -> Iterator[None]:
    """Set each ``(object, attribute, value)``; restore the originals on exit."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


@dataclass(frozen=True, slots=True)
class Mutant:
    name: str
    rule: str  # the production rule it breaks
    patches: Callable[[], list[Patch]]


_real_claim = fencing.guarded.guarded_claim
_real_process = fencing.guarded.guarded_process
_real_observe = fencing.guarded.guarded_observe
_real_skip = fencing.guarded.guarded_skip


def _adopt_observed() -> list[Patch]:
    async def claim(store: Any, claims: Any, *, lifetime: str, wait: Any, check_live: Any,
                    hooks: Any = fencing.guarded.NO_HOOKS) -> Any:
        async def one() -> Any:
            try:
                return await store.claim(claims, lifetime=lifetime)
            except OutcomeUnknown:
                seen = await store.observe([c.tp for c in claims])
                return {tp: t for tp, t in seen.items() if t is not None}
        return await with_policy(one, wait=wait, check_live=check_live)
    return [(consumer.lifecycle, "guarded_claim", claim)]


def _no_live_check() -> list[Patch]:
    def noop() -> None:
        return None

    def blind(real: Any) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            kwargs["check_live"] = noop
            return await real(*args, **kwargs)
        return call
    return [(consumer.lifecycle, "guarded_claim", blind(_real_claim)),
            (consumer.lifecycle, "guarded_process", blind(_real_process)),
            (consumer.lifecycle, "guarded_observe", blind(_real_observe)),
            (consumer.lifecycle, "guarded_skip", blind(_real_skip)),
            (consumer.lifecycle, "with_policy", blind(with_policy))]


def _any_reread_committed() -> list[Patch]:
    def resolve(*, sent: Token, batch_end: int, observed: Token | None) -> Resolution:
        return Resolution.COMMITTED
    return [(fencing.guarded, "resolve_process", resolve)]


def _same_epoch_committed() -> list[Patch]:
    def resolve(*, sent: Token, batch_end: int, observed: Token | None) -> Resolution:
        if observed is not None and observed.epoch == sent.epoch:
            return Resolution.COMMITTED
        return Resolution.FENCED
    return [(fencing.guarded, "resolve_process", resolve)]


def _retire_noop() -> list[Patch]:
    async def retire(self: Any, reason: str, *, journal: bool, holding: Any = None) -> None:
        return None
    return [(consumer.lifetime_gate.LifetimeGate, "retire", retire)]


def _seek_unchecked() -> list[Patch]:
    # (comparing the epoch alone is an equivalent mutant: a retained token never differs
    # from the durable row in its frontier alone while the lifetime is live)
    def matches(retained: Token, observed: Token | None) -> bool:
        return True
    return [(consumer.decisions, "seek_matches", matches)]


def _claim_unjournaled() -> list[Patch]:
    real = fencing.memory.store.MemoryFenceStore._apply_claim

    def apply(self: Any, claims: Any, lifetime: str, label: str) -> Any:
        before = len(self.journal_rows)
        tokens = real(self, claims, lifetime, label)
        del self.journal_rows[before:]
        return tokens
    return [(fencing.memory.store.MemoryFenceStore, "_apply_claim", apply)]


def _revoke_no_wait() -> list[Patch]:
    async def settle(self: Any, tps: Any) -> None:
        return None
    return [(consumer.lifetime_gate.LifetimeGate, "settle", settle)]


def _process_after_revoke() -> list[Patch]:
    async def revoke_locked(self: Any, tps: Any) -> None:
        for tp in sorted(set(tps)):
            token = self._tokens.get(tp)  # kept: a later process still finds it
            if token is not None:
                await self._store.journal([tp], lifetime=self.lifetime_id, event="release",
                                          epoch=token.epoch)
    return [(consumer.lifecycle.Lifecycle, "_revoke_locked", revoke_locked)]


def _frontier_from_kafka() -> list[Patch]:
    async def claim(store: Any, claims: Any, **kwargs: Any) -> Any:
        tokens = await _real_claim(store, claims, **kwargs)
        start = {c.tp: c.initial_frontier for c in claims}
        return {tp: Token(t.epoch, start[tp]) for tp, t in tokens.items()}
    return [(consumer.lifecycle, "guarded_claim", claim)]


def _resolve_without_read() -> list[Patch]:
    async def process(store: Any, call: Any, token: Token, *,
                      wait: Any, check_live: Any, hooks: Any = None) -> Token:
        end = call.records[-1].offset + 1

        async def one() -> Token:
            try:
                return await store.process(call, token)
            except OutcomeUnknown:
                return Token(token.epoch, end)
        return await with_policy(one, wait=wait, check_live=check_live)
    return [(consumer.lifecycle, "guarded_process", process)]


def _retry_blind() -> list[Patch]:
    async def process(store: Any, call: Any, token: Token, *,
                      wait: Any, check_live: Any, hooks: Any = None) -> Token:
        async def one() -> Token:
            try:
                return await store.process(call, token)
            except OutcomeUnknown as exc:
                raise NotCommitted("retrying blindly") from exc
        return await with_policy(one, wait=wait, check_live=check_live)
    return [(consumer.lifecycle, "guarded_process", process)]


def _stop_without_cancel() -> list[Patch]:
    real = consumer.lifetime_gate.LifetimeGate.stop

    def stop(self: Any) -> None:  # the state moves and tokens go, the calls in flight go on
        tasks, self.tasks = self.tasks, set()
        real(self)
        self.tasks = tasks
    return [(consumer.lifetime_gate.LifetimeGate, "stop", stop)]


def _gap_unrefused() -> list[Patch]:
    real = fencing.memory.store.decide_validation

    def validate(check: Any, row: Any) -> Any:  # the frontier is taken to be past the gap
        return real(check, None if row is None else (row[0], max(
            row[1], check.facts.low_watermark), row[2]))
    return [(fencing.memory.store, "decide_validation", validate)]


def _bisect_coarse() -> list[Patch]:
    real = fencing.failures.Bisection.next

    def next_(self: Any) -> Any:  # a failing pair blames its first record unprobed
        if self.bad_hi is not None and self.bad_hi - self.lo == 2:
            self.bad_hi = self.lo + 1
        return real(self)
    return [(fencing.failures.Bisection, "next", next_)]


def _lost_queued_ends() -> list[Patch]:
    def after(exc: BaseException, *, closing: bool) -> Any:  # the rule before the fix
        return consumer.decisions.BatchFailure.END
    return [(consumer.decisions, "after_batch_failure", after)]


def _lanes_successor_blind() -> list[Patch]:
    def completion(self: Any, tp: Any) -> Any:  # the set the claim read is not handed on
        return None
    return [(consumer.lifecycle.Lifecycle, "completion", completion)]


def _lanes_frontier_past_hole() -> list[Patch]:
    def frontier(self: Any) -> int:  # the end of the highest span, holes below it or not
        return self.spans[-1][1] + 1 if self.spans else self.base
    return [(fencing.lanes.Completion, "frontier", property(frontier))]


def _lanes_overtake() -> list[Patch]:
    def lane_of(key: Any, lanes: int, *, offset: int = 0, null_any: bool = False) -> int:
        return offset % lanes  # a key's records spread over the lanes
    return [(fencing.lanes, "lane_of", lane_of)]


MUTANTS: tuple[Mutant, ...] = (
    Mutant("adopt-observed-epoch", "an unknown claim adopts the epoch it re-reads",
           _adopt_observed),
    Mutant("no-live-check", "no liveness/budget check before calls and retries",
           _no_live_check),
    Mutant("any-reread-committed", "any re-read of an unknown commit counts as committed",
           _any_reread_committed),
    Mutant("retire-noop", "retirement does nothing (gate stays open, tokens kept)",
           _retire_noop),
    Mutant("same-epoch-committed", "same epoch on re-read counts as committed",
           _same_epoch_committed),
    Mutant("seek-unchecked", "seek returns the retained frontier without comparing the "
           "durable token", _seek_unchecked),
    Mutant("claim-unjournaled", "the store's claim writes no journal row", _claim_unjournaled),
    Mutant("revoke-no-wait", "revoke/assign do not wait for in-flight batches",
           _revoke_no_wait),
    Mutant("process-after-revoke", "revoke journals release but keeps the token (late calls "
           "still process)", _process_after_revoke),
    Mutant("frontier-from-kafka", "the retained frontier is the claim request's initial "
           "frontier (Kafka's), not the durable row's", _frontier_from_kafka),
    Mutant("resolve-without-read", "an unknown commit is treated as committed without a read",
           _resolve_without_read),
    Mutant("retry-without-reread", "an unknown commit is retried without re-reading",
           _retry_blind),
    Mutant("stop-without-cancel", "stop moves the state but leaves the calls in flight "
           "running", _stop_without_cancel),
    Mutant("gap-unrefused", "the source check ignores records deleted below the durable "
           "frontier", _gap_unrefused),
    Mutant("lost-queued-ends-lifetime", "a batch queued behind its guard when the assignment "
           "is lost ends the lifetime instead of being dropped", _lost_queued_ends),
    Mutant("bisect-pair-unprobed", "bisection blames the first of a failing pair of records "
           "without probing it", _bisect_coarse),
    Mutant("lanes-successor-ignores-completion", "a successor's lanes start from the durable "
           "frontier without the completion set its claim read", _lanes_successor_blind),
    Mutant("lanes-frontier-past-unfinished", "the effective frontier is the end of the "
           "highest applied span, past a lane still unfinished below it",
           _lanes_frontier_past_hole),
    Mutant("lanes-overtake-key", "records are dispatched to lanes by offset, so a key's "
           "later record can overtake its earlier one", _lanes_overtake),
)


# Each mutant's first killing run of the sweep (seeds ascending, ``valid`` before
# ``conflict``), pinned: ``tests/sim/test_mutants.py`` checks in ``make test`` that the
# pinned run kills it, that every run before it lets it live, and that the healthy code
# passes the pinned run; ``make sim-mutants`` reports a pin the generator has moved.
FIRST_KILLS: dict[str, tuple[int, str]] = {
    "adopt-observed-epoch": (41, "conflict"), "no-live-check": (14, "valid"),
    "any-reread-committed": (2, "conflict"), "retire-noop": (1, "valid"),
    "same-epoch-committed": (2, "conflict"), "seek-unchecked": (3, "conflict"),
    "claim-unjournaled": (1, "valid"), "revoke-no-wait": (11, "valid"),
    "process-after-revoke": (1, "conflict"), "frontier-from-kafka": (1, "valid"),
    "resolve-without-read": (2, "conflict"), "retry-without-reread": (1, "conflict"),
    "stop-without-cancel": (4, "valid"), "gap-unrefused": (1, "valid"),
    "lost-queued-ends-lifetime": (1, "conflict"), "bisect-pair-unprobed": (6, "conflict"),
    "lanes-successor-ignores-completion": (16, "conflict"),
    "lanes-frontier-past-unfinished": (78, "conflict"), "lanes-overtake-key": (9, "valid"),
}


def runs_up_to(seed: int, klass: str) -> list[tuple[int, str]]:
    """The sweep's runs in order, up to and including ``(seed, klass)``."""
    order = [(s, k) for s in range(1, seed + 1) for k in CLASSES]
    return order[: order.index((seed, klass)) + 1]


# -- evidence ------------------------------------------------------------------------------
def _kills(seed: int, klass: str, steps: int) -> str | None:
    _, _, report = run_one(seed, klass, steps=steps)
    return failure_of(report)


def _corpus_kills(mutant: Mutant, steps: int) -> list[dict[str, Any]]:
    out = []
    with patched(mutant.patches()):
        for seed in CORPUS_SEEDS:
            for klass in CLASSES:
                t1, r1, report = run_one(seed, klass, steps=steps)
                t2, r2, _ = run_one(seed, klass, steps=steps)
                failure = failure_of(report)
                if failure is None and (t1, r1) != (t2, r2):
                    failure = "NONDETERMINISTIC"
                if failure is not None:
                    out.append({"seed": seed, "class": klass, "failure": failure})
    return out


def _sweep_first(args: tuple[int, int, int, int, int]) -> dict[str, Any] | None:
    index, first, last, stride, steps = args
    mutant = MUTANTS[index]
    with patched(mutant.patches()):
        for seed in range(first, last + 1, stride):
            for klass in CLASSES:
                failure = _kills(seed, klass, steps)
                if failure is not None:
                    return {"seed": seed, "class": klass, "failure": failure}
    return None


def kill_table(*, sweep_last: int = 1000, steps: int = 64, processes: int = 2,
               names: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per mutant: corpus kills and the smallest killing sweep seed (or None)."""
    chosen = [i for i, m in enumerate(MUTANTS) if not names or m.name in names]
    rows: list[dict[str, Any]] = []
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(processes) as pool:
        for i in chosen:
            m = MUTANTS[i]
            corpus = _corpus_kills(m, steps)
            jobs = [(i, 1 + k, sweep_last, processes, steps) for k in range(processes)]
            found = [f for f in pool.map(_sweep_first, jobs) if f is not None]
            first = min(found, key=lambda f: (f["seed"], f["class"])) if found else None
            pinned = FIRST_KILLS.get(m.name)
            rows.append({"mutant": m.name, "rule": m.rule, "corpus_kills": len(corpus),
                         "corpus_runs": 2 * len(CORPUS_SEEDS),
                         "corpus_first": corpus[0] if corpus else None,
                         "sweep_last": sweep_last, "sweep_first_kill": first,
                         "killed": bool(corpus) or first is not None,
                         "pinned": None if pinned is None else list(pinned),
                         "pin_holds": first is not None and pinned == (first["seed"],
                                                                       first["class"])})
    return rows


def render_table(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = [f"| mutant | corpus ({2 * len(CORPUS_SEEDS)} runs) | sweep 1..N: first killing "
             "seed | killed |",
             "|---|---|---|---|"]
    for r in rows:
        first = r["sweep_first_kill"]
        sweep = (f"seed {first['seed']} {first['class']}: {first['failure'][:60]}"
                 if first else f"survives 1..{r['sweep_last']}")
        lines.append(f"| {r['mutant']} | {r['corpus_kills']}/{r['corpus_runs']} | {sweep} | "
                     f"{'yes' if r['killed'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import logging

    logging.getLogger("fenceworker").addHandler(logging.NullHandler())
    p = argparse.ArgumentParser(prog="python -m ops.sim.mutants")
    p.add_argument("--last", type=int, default=1000, help="sweep seeds 1..LAST (1000)")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("artifacts/sim/mutants.json"))
    p.add_argument("--only", action="append", default=[], help="mutant name (repeatable)")
    args = p.parse_args(argv)
    rows = kill_table(sweep_last=args.last, processes=args.processes, names=args.only)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(render_table(rows))
    survivors = [r["mutant"] for r in rows if not r["killed"]]
    print(f"{len(rows) - len(survivors)}/{len(rows)} killed"
          + (f"; survivors: {', '.join(survivors)}" if survivors else ""))
    moved = [r["mutant"] for r in rows if r["killed"] and not r["pin_holds"]]
    if moved:  # the generator changed: the pins (and docs/simulation.md's table) follow it
        print(f"first killing run moved from its pin in FIRST_KILLS: {', '.join(moved)}")
    return 0 if not survivors and not moved else 1


if __name__ == "__main__":
    raise SystemExit(main())
