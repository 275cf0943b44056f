"""The judgement of one cell: pure, over ``CellFacts``.

Rules (what PASS means; each broken rule is one line in ``Verdict.problems``)
- The point fired exactly once, in A, with the plan's signal; A then ended as planned:
  SIGKILL (return code -9), or for the zombie frozen at its marker, then exit 3 (retired)
  once continued. The successor B stopped with exit 0.
- The reference oracle finds no problem: effects equal the fold of the source below the
  frontiers, quarantine as expected, no duplicate, no loss; every frontier is at its
  partition's high watermark.
- Claims are journaled with strictly increasing epochs per partition, and each partition
  row's epoch is its last claim's.
- Nothing written by A after its marker: no frontier move, claim or quarantine row under an
  epoch A claimed, no journal row of A's lifetimes, no member heartbeat of A, later than the
  marker. Exception for the continued zombie only: its own member row and one ``retire``
  journal row, reported as ``bookkeeping`` (the documented last write of a retiring lifetime;
  they never touch epochs, frontiers or effects).
- The member row's time is ``now()`` of one autocommit upsert: the server's start of the
  statement, which a heartbeat sent on the loop just before SIGKILL can reach after the
  marker's time (seen at ``in-shutdown``: the ``stopping`` row, sent when SIGTERM changed
  the state, started on the server after the marker). After a SIGKILL (the marker's write
  and the signal are one synchronous call, so A issues nothing later), A's member row later
  than the marker is bookkeeping "in flight at the kill" unless its state is one written
  only at a clean end (``stopped``), which A never reaches. The other rows stay strict: a
  frontier, quarantine or journal row of A later than the marker is a problem.
- Point-specific: the marker's batch is durable after A's death (``commit-in-flight``,
  ``after-commit``) or not (``in-handler``, ``zombie``); the proxy held the COMMIT reply
  (``commit-in-flight``); a gap is skipped exactly once per gapped partition.
- Recovery seconds: A's marker to the first frontier move by another epoch on a partition A
  held at its death (any partition if A held none).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from consumer.observability.heartbeat import MemberState
from fencing.lanes import Completion
from tests.crash.facts import CellFacts, Marker
from tests.crash.plans import CellPlan

__all__ = ["Verdict", "judge"]


@dataclass(frozen=True, slots=True)
class Verdict:
    problems: tuple[str, ...]
    recovery_s: float | None
    a_lifetimes: tuple[str, ...] = ()
    bookkeeping: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.problems


def judge(plan: CellPlan, facts: CellFacts, *, gap_partitions: dict[int, int] | None = None
          ) -> Verdict:
    problems: list[str] = []
    marker = _one_marker(plan, facts, problems)
    _ends(plan, facts, problems)
    problems.extend(f"oracle: {p}" for p in facts.oracle_problems)
    final = {r.partition: r for r in facts.final}
    for p, hw in sorted(facts.high_watermarks.items()):
        got = final[p].frontier if p in final else None
        if got != hw:
            problems.append(f"partition {p}: frontier {got}, high watermark {hw}")
    _claims(facts, problems)
    a_lifetimes = _a_lifetimes(facts)
    a_epochs = {(j.partition, j.epoch) for j in facts.journal
                if j.event == "claim" and j.lifetime in a_lifetimes}
    bookkeeping: list[str] = []
    recovery = None
    if marker is not None:
        _after_marker(plan, facts, marker.at, a_lifetimes, a_epochs, problems, bookkeeping)
        _batch_state(plan, facts, marker, problems)
        recovery = _recovery(facts, marker.at, a_lifetimes, a_epochs, problems)
    if plan.hold_commit_reply and facts.commit_reply_held is not True:
        problems.append("the proxy never held a COMMIT reply of A")
    for p, low in sorted((gap_partitions or {}).items()):
        skips = [j for j in facts.journal if j.partition == p and j.event == "gap-skip"]
        if len(skips) != 1:
            problems.append(f"partition {p}: {len(skips)} gap-skip journal rows, expected 1")
        at_death = {r.partition: r.frontier for r in facts.at_death}.get(p)
        if at_death is None or at_death < low:
            problems.append(f"partition {p}: frontier {at_death} at A's death, below the low "
                            f"watermark {low} although A's gap-skip committed")
    return Verdict(tuple(problems), recovery, tuple(sorted(a_lifetimes)), tuple(bookkeeping))


def _one_marker(plan: CellPlan, facts: CellFacts, problems: list[str]) -> Marker | None:
    point = plan.arm.partition("@")[0]
    if not facts.markers:
        problems.append(f"the point {plan.arm} never fired (no marker)")
        return None
    if len(facts.markers) != 1:
        problems.append(f"{len(facts.markers)} marker lines, expected 1")
    m = facts.markers[0]
    if (m.point, m.pid, m.signal_name) != (point, facts.a_pid, plan.signal_name):
        problems.append(f"marker {m.point} pid={m.pid} SIG{m.signal_name}, expected {point} "
                        f"pid={facts.a_pid} SIG{plan.signal_name}")
    return m


def _ends(plan: CellPlan, facts: CellFacts, problems: list[str]) -> None:
    if plan.signal_name == "KILL" and facts.a_exit != -9:
        problems.append(f"A ended with {facts.a_exit}, expected -9 (SIGKILL at its point)")
    if plan.signal_name == "STOP":
        if not facts.a_stopped_at_marker:
            problems.append("A was not frozen (state T) at its marker")
        if facts.a_exit != 3:
            problems.append(f"the continued zombie A ended with {facts.a_exit}, expected 3")
    if facts.b_exit != 0:
        problems.append(f"successor B ended with {facts.b_exit}, expected 0")


def _claims(facts: CellFacts, problems: list[str]) -> None:
    last: dict[int, int] = {}
    for j in facts.journal:
        if j.event != "claim" or j.epoch is None:
            continue
        if j.partition in last and j.epoch <= last[j.partition]:
            problems.append(f"partition {j.partition}: claim epoch {j.epoch} after "
                            f"{last[j.partition]} (not strictly increasing)")
        last[j.partition] = j.epoch
    for r in facts.final:
        if last.get(r.partition) != r.epoch:
            problems.append(f"partition {r.partition}: row epoch {r.epoch}, last journaled "
                            f"claim {last.get(r.partition)}")


def _a_lifetimes(facts: CellFacts) -> set[str]:
    """A's lifetimes: its member rows (by pid), and claims by no member of B nor the setup."""
    b = {m.lifetime_id for m in facts.members if m.pid is not None and m.pid == facts.b_pid}
    a = {m.lifetime_id for m in facts.members if m.pid == facts.a_pid}
    a |= {j.lifetime for j in facts.journal if j.event == "claim" and j.lifetime is not None}
    return a - b - set(facts.setup_lifetimes)


#: a lifetime writes it only as it ends cleanly (``MemberHeartbeat.close``), after every point
_CLEAN_END = MemberState.STOPPED.value


def _after_marker(plan: CellPlan, facts: CellFacts, t: float, a_lifetimes: set[str],
                  a_epochs: set[tuple[int, int | None]], problems: list[str],
                  bookkeeping: list[str]) -> None:
    zombie = plan.signal_name == "STOP"
    for r in facts.audit:
        if r.at > t and (r.partition, r.epoch) in a_epochs:
            problems.append(f"A wrote after its marker: partition {r.partition} frontier "
                            f"{r.old_frontier}->{r.frontier} under its epoch {r.epoch}")
    for q in facts.quarantine:
        if q.at > t and (q.partition, q.epoch) in a_epochs:
            problems.append(f"A wrote after its marker: quarantine {q.partition}@{q.offset} "
                            f"under its epoch {q.epoch}")
    retires: dict[str, int] = defaultdict(int)
    for j in facts.journal:
        if j.at > t and j.lifetime in a_lifetimes:
            if zombie and j.event == "retire":
                retires[j.lifetime] += 1
                bookkeeping.append(f"journal retire {j.partition} epoch {j.epoch}")
            else:
                problems.append(f"A wrote after its marker: journal {j.event} partition "
                                f"{j.partition} epoch {j.epoch}")
    for m in facts.members:
        if m.lifetime_id in a_lifetimes and m.last_seen > t:
            if zombie:
                bookkeeping.append(f"member row {m.lifetime_id} state {m.state}")
            elif m.state != _CLEAN_END:
                bookkeeping.append(f"member row {m.lifetime_id} state {m.state} in flight at "
                                   "the kill")
            else:
                problems.append(f"A wrote after its marker: member heartbeat {m.lifetime_id} "
                                f"state {m.state}")


def _partition_of(marker: Marker) -> int | None:
    text = str(marker.fields.get("partition", ""))
    if not text.endswith("]") or "[" not in text:
        return None
    return int(text.rsplit("[", 1)[1][:-1])


def _batch_state(plan: CellPlan, facts: CellFacts, marker: Marker, problems: list[str]) -> None:
    if not plan.batch_state:
        return
    p = _partition_of(marker)
    if marker.fields.get("lane"):
        _lane_state(plan, facts, marker, p, problems)
        return
    at_death = {r.partition: r.frontier for r in facts.at_death}.get(p) if p is not None \
        else None
    start, end = marker.fields.get("frontier"), marker.fields.get("batch_end")
    if plan.batch_state == "durable" and (at_death is None or end is None or at_death < end):
        problems.append(f"the marker's batch (partition {p}, ..{end}) is not durable after A's "
                        f"death: frontier {at_death}")
    if plan.batch_state == "not-durable" and at_death != start:
        problems.append(f"the marker's batch (partition {p}, from {start}) should not be "
                        f"durable after A's death: frontier {at_death}")


def _lane_state(plan: CellPlan, facts: CellFacts, marker: Marker, p: int | None,
                problems: list[str]) -> None:
    """A lane's batch: durable means its first and last records are in the completion set
    at A's death (below the frontier or inside a span); not durable, neither."""
    base, spans = facts.lanes_at_death.get(p, (0, ())) if p is not None else (0, ())
    done = Completion.of(base, spans)
    first, last = marker.fields.get("first_offset"), marker.fields.get("last_offset")
    if not isinstance(first, int) or not isinstance(last, int):
        problems.append(f"the lane marker names no offsets: {dict(marker.fields)}")
        return
    got = (done.done(first), done.done(last))
    if plan.batch_state == "durable" and got != (True, True):
        problems.append(f"the marker's lane batch (partition {p}, {first}..{last}) is not "
                        f"durable after A's death: done {got}, frontier {base}")
    if plan.batch_state == "not-durable" and got != (False, False):
        problems.append(f"the marker's lane batch (partition {p}, {first}..{last}) should not "
                        f"be durable after A's death: done {got}, frontier {base}")


def _recovery(facts: CellFacts, t: float, a_lifetimes: set[str],
              a_epochs: set[tuple[int, int | None]], problems: list[str]) -> float | None:
    held = {r.partition for r in facts.at_death if r.owner in a_lifetimes} or \
        set(facts.high_watermarks)
    pending = {r.partition for r in facts.at_death if r.partition in held
               and r.frontier < facts.high_watermarks.get(r.partition, 0)}
    pending |= held - {r.partition for r in facts.at_death}
    if not pending:
        return None  # nothing was left to do on A's partitions
    for r in facts.audit:
        if r.at > t and r.partition in pending and (r.partition, r.epoch) not in a_epochs \
                and r.old_frontier is not None and r.frontier > r.old_frontier:
            return r.at - t
    problems.append("no successor commit on a partition A held")
    return None
