"""Oracle checks of the simulator: committed state against the reference oracle's fold of
the processed source prefix, plus the fence's own invariants.

Long because every oracle rule reads the same store snapshot after every call; one module
keeps them against one incremental view (the partitions' folds, the writes seen so far).

Rules (each failed rule is one violation string naming the place it was seen)
- ``ops.reference.oracle.check`` at the durable frontiers: documents, outbox and
  quarantine equal the fold (records given up by a gap-skip are excluded from it);
  outbox sequences/versions consistent; quarantine and progress agree.
- Committed intent never changes: an outbox or quarantine row, once committed, stays.
- A stale token never commits: every process/skip write carries the epoch of the latest
  claim of its partition and that claim's lifetime.
- A lifetime stopped or retired at a check before writes nothing but its ``retire`` row.
- The journal agrees with the rows: every row's epoch has the ``claim`` journal row of its
  owner; a lifetime writes no process/skip for a partition it released (``release``
  journal row) until it claims it again.
- Attempts (checked after every attempt): a failed call that held a token, or ended
  ``retired``/``refused``, leaves its lifetime out of LIVE (failures retire); a call whose
  lifetime was stopped in flight (any store call, validate and seek included) ends
  ``retired`` with the lifetime STOPPED (or RETIRED, if it already was) and tokenless;
  each batch (several may be in flight in one step) reported ok has its end at or below
  the durable frontier, and one reported failed had no commit acknowledged to it; no
  guarded store call of a lifetime (journal and heartbeat rows are best effort, not
  guarded) starts after the budget of the lifecycle call it serves.
- Tokens (checked after every attempt): a live lifetime's retained token is never ahead
  of the durable one, nor at the same epoch with another frontier; a successful seek
  returns the durable frontier under the durable token; a lifetime is never fenced under
  the epoch it held.
- Lanes (a lanes config, ``ops.sim.lanes``): the fold above is of each partition's durable
  completion set (records below the frontier or inside an applied span, in offset order),
  and so are the progress rules; every lane write applies records no write applied before
  (exactly once) and only after every earlier record of the same key in its partition was
  applied or given up (per-key order); a lane batch reported ok lies inside the durable set;
  lane and fold writes obey the stale-token, stopped and released rules.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from consumer.decisions import LifetimeState
from consumer.lifecycle import Lifecycle
from fencing.errors import Fenced
from fencing.lanes import Completion
from fencing.memory.store import MemoryFenceStore
from fencing.types import SourceRecord, Token, TopicPartition
from ops.reference import oracle
from ops.reference.snapshot import memory_store_state
from ops.sim.failures import Ranges, failure_rows

__all__ = ["Checker"]


class _PartitionFolds:
    """``oracle.fold_prefix`` of one source at any frontiers, folding each partition's
    records once (``oracle.Folder``) and joining the partitions' states. Exact because the
    oracle refuses a document in two partitions: then the partitions' folds are disjoint.
    A source with a key in two partitions folds the whole prefix each time (as
    ``fold_prefix``, which raises where the oracle would); a frontier that moves back
    refolds its partition from the start."""

    def __init__(self, source: Sequence[SourceRecord]) -> None:
        self._source = source
        self._records: dict[tuple[str, int], list[SourceRecord]] = {}
        for r in source:
            self._records.setdefault((r.topic, r.partition), []).append(r)
        home: dict[bytes, int] = {}  # a document's id is its key: one partition per key
        self._homed = all(home.setdefault(r.key, r.partition) == r.partition
                          for r in source if r.key is not None)  # else: fold_prefix raises
        self._folders: dict[tuple[str, int], oracle.Folder] = {}
        self._parts: dict[tuple[tuple[str, int], int], oracle.Expected] = {}
        self._whole: dict[tuple[Any, ...], tuple[oracle.Expected, list[str] | None]] = {}
        self._part_problems: dict[tuple[tuple[str, int], int], list[str]] = {}

    def _part(self, tp: tuple[str, int], frontier: int) -> tuple[int, oracle.Expected]:
        records = self._records.get(tp, [])
        n = bisect.bisect_left([r.offset for r in records], frontier)
        state = self._parts.get((tp, n))
        if state is None:
            folder = self._folders.get(tp)
            if folder is None or folder.added > n:
                folder = self._folders[tp] = oracle.Folder()
            for r in records[folder.added:n]:
                folder.add(r)
            state = self._parts[(tp, n)] = folder.state()
        return n, state

    def expected(self, frontiers: Mapping[tuple[str, int], int]
                 ) -> tuple[oracle.Expected, Callable[[], list[str]]]:
        """The fold at ``frontiers`` and (memoized) ``oracle.outbox_problems`` of it."""
        if not self._homed:
            exp = oracle.fold_prefix(self._source, frontiers)
            return exp, lambda: oracle.outbox_problems(exp)
        parts = [(tp, *self._part(tp, f)) for tp, f in sorted(frontiers.items())]
        key = tuple((tp, n) for tp, n, _ in parts)
        hit = self._whole.get(key)
        if hit is None:
            docs: dict[Any, Any] = {}
            outbox: dict[Any, Any] = {}
            quarantine: dict[Any, Any] = {}
            for _, _, state in parts:
                docs.update(state.documents)
                outbox.update(state.outbox)
                quarantine.update(state.quarantine)
            hit = self._whole[key] = (oracle.Expected(docs, outbox, quarantine), None)
        exp = hit[0]

        def consistency() -> list[str]:
            problems = self._whole[key][1]
            if problems is None:  # the partitions' documents are disjoint: no problem in
                # any partition's fold means none in their union (else ask the union)
                clean = all(not self._problems(tp, n) for tp, n, _ in parts)
                problems = [] if clean else oracle.outbox_problems(exp)
                self._whole[key] = (exp, problems)
            return list(problems)
        return exp, consistency

    def _problems(self, tp: tuple[str, int], n: int) -> list[str]:
        problems = self._part_problems.get((tp, n))
        if problems is None:
            problems = self._part_problems[(tp, n)] = oracle.outbox_problems(
                self._parts[(tp, n)])
        return problems


_DATA = ("process", "skip", "lane", "fold")  # writes under a partition's token


class Checker:
    """Runs every rule against ``store``; collects violations (first ``limit``)."""

    def __init__(self, store: MemoryFenceStore, source: Sequence[SourceRecord],
                 *, dead: Callable[[], AbstractSet[str]], limit: int = 20,
                 enabled: bool = True) -> None:
        self.enabled = enabled  # False: every rule is skipped (the generator's own run)
        self._store = store
        self._dead_now = dead
        self._limit = limit
        self.source: tuple[SourceRecord, ...] = tuple(source)
        self.violations: list[str] = []
        self._folds = _PartitionFolds(self.source)
        self._outbox: dict[Any, Any] = {}
        self._quarantine: dict[Any, Any] = {}
        self._writes_seen = 0
        self._latest_claim: dict[TopicPartition, tuple[int | None, str | None]] = {}
        self._dead: AbstractSet[str] = frozenset()
        self._journal_seen = 0
        self._last_seen: tuple[Any, ...] | None = None
        self._last_data: tuple[Any, ...] | None = None
        self._scanned = self._data_writes = 0
        self._claims_journaled: set[tuple[TopicPartition, int | None, str]] = set()
        self._released: set[tuple[TopicPartition, str | None]] = set()
        self.checks = self.excluded = self._skips_seen = 0
        self._converted: dict[int, tuple[Any, Any]] = {}  # table entry -> its oracle row
        self.poison: frozenset[tuple[int, int]] | None = None  # ops.sim.failures, when on
        self.gone = Ranges()  # given up by gap-skips and accepted gaps: owed nothing
        self.lanes = False  # a lanes config: state and progress by completion sets
        self._applied: dict[TopicPartition, set[int]] = {}  # offsets lane writes applied

    def exclude(self, tp: TopicPartition, first: int, end: int) -> None:
        """Drop source records of ``tp`` in [first, end) (an accepted retention gap);
        ``excluded`` counts the records dropped."""
        # also where no record is left: one left out (``leave_out``) is given up too
        self.gone.add(tp.partition, first, end)
        kept = tuple(r for r in self.source if not (r.tp == tp and first <= r.offset < end))
        if len(kept) == len(self.source):
            return
        self.excluded += len(self.source) - len(kept)
        self.source = kept
        self._folds = _PartitionFolds(self.source)
        self._last_seen = self._last_data = None

    def leave_out(self, records: AbstractSet[tuple[int, int]]) -> None:
        """(partition, offset) records the failure path never applies: out of the fold."""
        kept = tuple(r for r in self.source if (r.partition, r.offset) not in records)
        if len(kept) != len(self.source):  # not counted as ``excluded``
            self.source, self._folds = kept, _PartitionFolds(kept)
            self._last_seen = self._last_data = None

    def fail(self, place: str, problem: str) -> None:
        """Record one violation seen at ``place``."""
        if self.enabled and len(self.violations) < self._limit:
            self.violations.append(f"{place}: {problem}")

    def check(self, place: str) -> None:
        if not self.enabled:
            return
        self.checks += 1
        store = self._store
        seen = (len(store.writes), len(store.journal_rows), len(store.quarantine),
                tuple(store.rows.items()))  # rows are frozen: a change is a new Row
        if seen == self._last_seen:  # nothing durable changed since the last full check
            self._dead = self._dead_now()
            return
        self._last_seen = seen
        writes = store.writes
        for w in writes[self._skips_seen:]:  # a gap-skip gives records up: not owed any more
            if w.kind == "lane" and self.lanes:
                self._lane_write(place, w)
            if w.skipped is not None:
                self.give_up(w.tp, *w.skipped)
        self._skips_seen = len(writes)
        for w in writes[self._scanned:]:
            if w.kind in ("process", "skip", "lane"):
                self._data_writes += 1
        self._scanned = len(writes)
        frontiers = {(tp.topic, tp.partition): row.frontier
                     for tp, row in sorted(self._store.rows.items())}
        data = (tuple(sorted(frontiers.items())), len(store.quarantine), self._data_writes)
        if data != self._last_data:  # claims and journal rows leave the fold's state alone
            self._last_data = data
            if self.lanes:
                self._check_sets(place)
            else:
                self._check_state(place, frontiers)
        self._check_writes(place)
        self._check_journal(place)

    def _check_state(self, place: str, frontiers: dict[tuple[str, int], int]) -> None:
        actual = memory_store_state(self._store, memo=self._converted)
        if self.poison is not None:  # the failure path's rows: ops.sim.failures
            actual = failure_rows(self, place, actual, frontiers)
        expected, consistency = self._folds.expected(frontiers)
        same = actual == expected  # then the outbox rules give what they give the fold
        for problem in (*oracle.progress_problems(actual, frontiers),
                        *(consistency() if same else oracle.outbox_problems(actual)),
                        *(() if same else oracle.diff(expected, actual))):
            self.fail(place, problem)
        for name, before, now in (("outbox", self._outbox, actual.outbox),
                                  ("quarantine", self._quarantine, actual.quarantine)):
            for k, v in before.items():
                if now.get(k) is not v and now.get(k) != v:  # the same object: unchanged
                    self.fail(place, f"committed {name} row {k} changed from {v} to "
                                      f"{now.get(k)}")
        self._outbox, self._quarantine = dict(actual.outbox), dict(actual.quarantine)

    def completion(self, tp: TopicPartition) -> Completion:
        """The durable completion set of ``tp`` (empty at 0 before its first claim)."""
        row = self._store.rows.get(tp)
        spans = (sp for _, got in self._store.completion_rows.get(tp, ()) for sp in got)
        return Completion.of(0 if row is None else row.frontier, spans)

    def _check_sets(self, place: str) -> None:
        """The effects against the fold of every partition's durable completion set."""
        actual = memory_store_state(self._store, memo=self._converted)
        sets: dict[tuple[str, int], Completion] = {}

        def done(topic: str, partition: int, offset: int) -> bool:
            got = sets.get((topic, partition))
            if got is None:
                got = sets[(topic, partition)] = self.completion(
                    TopicPartition(topic, partition))
            return got.done(offset)

        expected = oracle.fold(r for r in self.source if done(r.topic, r.partition, r.offset))
        problems = [f"quarantine row {k!r} is not in its partition's completion set"
                    for k in actual.quarantine if not done(*k[:3])]
        problems.extend(f"outbox row {k!r} comes from offset {r.offset}, not in its "
                        "partition's completion set" for k, r in actual.outbox.items()
                        if not done(k[0], r.partition, r.offset))
        problems.extend(oracle.outbox_problems(actual))
        problems.extend(oracle.diff(expected, actual))
        for problem in problems:
            self.fail(place, problem)
        for name, before, now in (("outbox", self._outbox, actual.outbox),
                                  ("quarantine", self._quarantine, actual.quarantine)):
            for k, v in before.items():
                if now.get(k) != v:
                    self.fail(place, f"committed {name} row {k} changed from {v} to "
                                      f"{now.get(k)}")
        self._outbox, self._quarantine = dict(actual.outbox), dict(actual.quarantine)

    def _lane_write(self, place: str, w: Any) -> None:
        """Exactly once and per-key order of one lane write (writes are seen in order)."""
        applied = self._applied.setdefault(w.tp, set())
        mine = [r for r in self.source if r.tp == w.tp]
        for first, last in w.spans:
            rec = next((r for r in mine if r.offset == last), None)
            if last in applied:
                self.fail(place, f"offset {last} of {w.tp} applied twice (lane write by "
                                 f"{w.lifetime} at epoch {w.epoch})")
            if rec is not None:
                for r in mine:
                    if (r.offset < last and r.key == rec.key and r.offset not in applied
                            and (w.tp.partition, r.offset) not in self.gone):
                        self.fail(place, f"offset {last} of {w.tp} (key {rec.key!r}) "
                                         f"applied before offset {r.offset} of its key")
                        break
            applied.update(range(first, last + 1))

    def give_up(self, tp: TopicPartition, first: int, end: int) -> None:
        """``exclude`` the records in [first, end), except (a lanes config) those a lane
        applied: a gap-skip or an accepted gap moves the frontier past them, not away."""
        if not self.lanes:
            self.exclude(tp, first, end)
            return
        applied = self._applied.get(tp, set())
        for r in [r for r in self.source if r.tp == tp and first <= r.offset < end]:
            if r.offset not in applied:
                self.exclude(tp, r.offset, r.offset + 1)

    def unapplied(self, partition: int) -> list[int]:
        """Source records of ``partition`` no lane write applied, not given up (a lanes
        config, after the drain: every one is owed)."""
        tps = {r.tp for r in self.source if r.partition == partition}
        applied = set().union(*(self._applied.get(tp, set()) for tp in tps))
        return [r.offset for r in self.source if r.partition == partition
                and r.offset not in applied and (partition, r.offset) not in self.gone]

    def _check_journal(self, place: str) -> None:
        rows = self._store.journal_rows
        for j in rows[self._journal_seen:]:
            if j.event == "claim":
                self._claims_journaled.add((j.tp, j.epoch, j.lifetime))
        self._journal_seen = len(rows)
        for tp, row in sorted(self._store.rows.items()):
            if (tp, row.epoch, row.owner or "") not in self._claims_journaled:
                self.fail(place, f"claim of {tp} at epoch {row.epoch} by {row.owner} has no "
                                 "claim journal row")

    def _check_writes(self, place: str) -> None:
        writes = self._store.writes
        for w in writes[self._writes_seen:]:
            if w.lifetime in self._dead and w.kind != "journal":
                self.fail(place, f"lifetime {w.lifetime} wrote {w.kind} {w.tp} after it "
                                  "stopped or retired")
            if w.kind == "claim":
                self._latest_claim[w.tp] = (w.epoch, w.lifetime)
                self._released.discard((w.tp, w.lifetime))
            elif w.kind == "journal" and w.event == "release":
                self._released.add((w.tp, w.lifetime))
            elif w.kind in _DATA and (w.tp, w.lifetime) in self._released:
                self.fail(place, f"lifetime {w.lifetime} wrote {w.kind} {w.tp} after it "
                                 "released the partition")
            if w.kind in _DATA:
                latest = self._latest_claim.get(w.tp)
                if latest != (w.epoch, w.lifetime):
                    self.fail(place, f"stale token committed: {w.kind} {w.tp} by "
                                      f"{w.lifetime} at epoch {w.epoch}, latest claim {latest}")
        self._writes_seen = len(writes)
        self._dead = self._dead_now()

    def retained_tokens(self, place: str, lifecycles: Mapping[int, Lifecycle],
                        tps: Sequence[TopicPartition]) -> None:
        """Retained tokens never run ahead of or behind durable state under one epoch."""
        durables: list[Token | None] | None = None
        for worker, lc in sorted(lifecycles.items()):
            if lc.state is not LifetimeState.LIVE:
                continue
            if durables is None:
                durables = [self._store.token_of(tp) for tp in tps]
            for tp, durable in zip(tps, durables, strict=True):
                token = lc.token(tp)
                if token is None:
                    continue
                if durable is None or token.epoch > durable.epoch or (
                        token.epoch == durable.epoch and token.frontier != durable.frontier):
                    self.fail(place, f"lifetime {worker} retains {token} for partition "
                                     f"{tp.partition}, durable {durable}")

    def seek_position(self, place: str, worker: int, tp: TopicPartition,
                      token: Token | None, cursor: int | None) -> None:
        """A successful seek leaves the durable token and returns the durable frontier."""
        durable = self._store.token_of(tp)
        if durable is None or token != durable or cursor != durable.frontier:
            self.fail(place, f"seek by lifetime {worker} returned {cursor} with token "
                             f"{token}; durable {durable}")

    def not_self_fenced(self, place: str, worker: int, tp: TopicPartition, held: Token,
                        exc: BaseException) -> None:
        """``Fenced`` (raised or chained) never comes while the durable epoch is ``held``'s."""
        fenced = exc if isinstance(exc, Fenced) else exc.__cause__
        if not isinstance(fenced, Fenced):
            return
        durable = self._store.token_of(tp)
        if durable is not None and durable.epoch == held.epoch:
            self.fail(place, f"lifetime {worker} was fenced under its own epoch "
                             f"{held.epoch} on partition {tp.partition} (a mis-resolved "
                             f"outcome): held {held}, durable {durable}")

    def attempt_outcome(self, place: str, *, worker: int, state: LifetimeState, result: str,
                        held: Token | None, actor: str) -> None:
        """Failures retire."""
        failed = result in ("retired", "refused") or (result == "fenced" and held is not None)
        if failed and state is LifetimeState.LIVE:
            self.fail(place, f"lifetime {worker} is still live after its {actor} ended "
                             f"{result}")

    def stopped_in_flight(self, place: str, *, worker: int, result: str, state: LifetimeState,
                          stopped_from: str, tokens: Sequence[Token | None]) -> None:
        """A lifecycle call whose lifetime was stopped while its store call was in flight
        ends ``retired`` (every batch of it), and the lifetime holds no token and is STOPPED
        (RETIRED when it had already retired for another reason when the stop came)."""
        want = (LifetimeState.RETIRED if stopped_from == LifetimeState.RETIRED.value
                else LifetimeState.STOPPED)
        if result != "retired" or state is not want or any(t is not None for t in tokens):
            self.fail(place, f"lifetime {worker} stopped in flight ended {result}, "
                             f"{state.value}, holding {[t for t in tokens if t is not None]}")

    def batch_outcome(self, place: str, *, worker: int, tp: TopicPartition, result: str,
                      batch_end: int | None, acked: bool) -> None:
        """A batch's reported outcome agrees with the committed state."""
        if batch_end is None:
            return
        durable = self._store.token_of(tp)
        if result == "ok" and (durable is None or durable.frontier < batch_end):
            self.fail(place, f"process by lifetime {worker} reported ok, batch end {batch_end} "
                             f"not committed (durable {durable})")
        if result != "ok" and acked:
            self.fail(place, f"process by lifetime {worker} reported {result} after its "
                             "commit was acknowledged")

    def lane_outcome(self, place: str, *, worker: int, tp: TopicPartition, lane: int,
                     offsets: Sequence[int], result: str) -> None:
        """A lane batch reported ok lies inside the durable completion set."""
        if result != "ok":
            return
        got = self.completion(tp)
        missing = [o for o in offsets if not got.done(o)]
        if missing:
            self.fail(place, f"lane {lane} of {tp} by lifetime {worker} reported ok, offsets "
                             f"{missing} not in the durable completion set {got}")

    def call_started_in_budget(self, place: str, worker: str, started_us: int,
                               call_us: int | None, budget_us: int) -> None:
        """No store call starts after the budget of the lifecycle call it serves."""
        if call_us is not None and started_us > call_us + budget_us:
            self.fail(place, f"lifetime {worker} started a store call "
                             f"{(started_us - call_us) // 1000} ms into a call whose budget is "
                             f"{budget_us // 1000} ms")
