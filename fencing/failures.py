"""Pure decisions about handler failures: classification, backoff, bisection, attempt limits.

Rules
- A handler exception becomes ``HandlerFailed`` inside the store, before the rollback; it is
  transient when a ``Transient`` is the exception or in its cause/context chain, or when the
  store's classifier says so (PostgreSQL: SQLSTATE 40001, 40P01, 55P03 and lost
  connections, ``fencing.postgres.classify.handler_transient``), and *unavailable* when
  that ``Transient`` is an ``Unavailable`` (a service the handler needs does not answer).
  Everything else is poison.
  A ``FenceError`` raised inside the handler (e.g. ``Retired`` from the retirement barrier)
  is never wrapped.
- Backoff before attempt n+1 is tenacity's ``wait_exponential`` (``min(max, initial *
  2^(n-1))``) with equal jitter: scaled by a factor in [0.5, 1) drawn from the injected
  ``random.Random``.
- ``Bisection`` finds poison records by committing prefixes: the range ``[lo, bad_hi)`` is
  known to hold a failure; a probe applies its lower half; success commits it (``lo``
  moves), failure shrinks the range. A range of one record is the poison record: it is
  quarantined in the next transaction together with whatever that transaction applies
  (``carry``), never in one of its own unless it ends the batch. Per poison record this
  costs at most ``ceil(log2(n))`` probe transactions; then one transaction tries the rest.
- Durable attempt counts (``Attempts``) are read once per assignment. A partition is
  *suspect* when a count exists for its frontier or its previous epoch ended without a
  ``release``/``retire`` journal row (a process death), or with one saying its suspect
  window was still open (``SUSPECT_OPEN``): its next records are then tried alone,
  process-wide (no other batch of the process in flight), each after its ``alone`` count
  was incremented in a committed write. Only ``alone`` counts deaths: a death while several
  records were in flight is blamed on none of them, and transient retries count in
  ``count``, never in ``alone``. A record whose ``alone`` count reached ``max_attempts`` is
  quarantined instead of tried (``ProcessDeath``). An attempt alone after a retry was
  counted and scheduled (the process died while backing off) is that retry: ``count`` does
  not grow twice for one run; an attempt alone whose lifetime then ended cleanly (a release
  or retire row: it did not die) is replaced by the next one instead of added to, in
  ``alone`` and in ``count`` (a handover or a lost reply interrupted it, not the record: a
  record's retries are not spent by its partition moving).
- An ``outcome-uncertain`` batch is preceded by a durable intent (its partition, the
  frontier it starts at and its last offset). An intent that starts at the durable frontier
  was never followed by a commit: its records' outcome is unknown (``Attempts.uncertain_to``)
  and they are never run again.
- Slow handlers: ``fencing.slow``.
- ``quarantine_cause`` names why a quarantined record is there, from its ``error_type``.
"""

from __future__ import annotations

import hashlib
import math
import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from tenacity import RetryCallState, wait_exponential

from fencing.errors import ConfigError, FenceError, HandlerFailed, Transient, Unavailable

__all__ = [
    "CAUSES",
    "SUSPECT_OPEN",
    "Attempts",
    "Bisection",
    "Probe",
    "RetryPolicy",
    "death_reason",
    "handler_failure",
    "marked_transient",
    "max_probes",
    "quarantine_cause",
    "too_slow_reason",
    "traceback_digest",
    "unknown_reason",
]

#: the journal detail of a release or retire row that leaves the next owner suspicious: the
#: partition's suspect window was still open (its records were not all tried alone yet)
SUSPECT_OPEN = "suspect window open"
#: the causes of a quarantined record (``quarantine_cause``), for status and metrics
CAUSES = ("rejected", "raised", "killed-the-process", "outcome-unknown", "too-slow")
_CAUSE_OF_TYPE = {"ProcessDeath": "killed-the-process", "OutcomeUnknown": "outcome-unknown",
                  "TooSlow": "too-slow"}


def quarantine_cause(error_type: str | None) -> str:
    """Why a record is quarantined: ``rejected`` (the handler's ``Reject``), ``raised``,
    ``killed-the-process``, ``outcome-unknown`` or ``too-slow`` (see ``CAUSES``)."""
    if error_type is None:
        return "rejected"
    return _CAUSE_OF_TYPE.get(error_type, "raised")



def marked_transient(exc: BaseException, kind: type[Transient] = Transient) -> bool:
    """True when ``exc`` or an exception in its cause/context chain is a ``kind``."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, kind):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def traceback_digest(exc: BaseException) -> str:
    """16 hex digits identifying where ``exc`` was raised (type and frames, no values)."""
    frames = traceback.extract_tb(exc.__traceback__)
    text = type(exc).__qualname__ + "|" + "|".join(
        f"{f.filename.rsplit('/', 1)[-1]}:{f.name}:{f.lineno}" for f in frames)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def handler_failure(exc: Exception, *, what: str,
                    transient: Callable[[BaseException], bool] | None = None) -> Exception:
    """The error a store raises for ``exc`` raised by the handler: ``exc`` itself for a
    ``FenceError``, else ``HandlerFailed`` (raise it ``from exc``)."""
    if isinstance(exc, FenceError):
        return exc
    unavailable = marked_transient(exc, Unavailable)
    is_transient = marked_transient(exc) or (transient is not None and transient(exc))
    message = str(exc)[:2000]
    kind = "unavailable" if unavailable else "transient" if is_transient else "poison"
    return HandlerFailed(
        f"{what}: handler raised {type(exc).__name__}: {message} ({kind})",
        transient=is_transient, error_type=type(exc).__qualname__, error_message=message,
        traceback_digest=traceback_digest(exc), unavailable=unavailable)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Transient retries and attempt limits of one worker (``fencectl run`` flags)."""

    initial_ms: int = 200  # first backoff (``--retry-initial-ms``)
    max_ms: int = 10_000  # longest backoff (``--retry-max-ms``)
    retry_max_attempts: int = 5  # attempts of a transient failure (``--retry-max-attempts``)
    max_attempts: int = 3  # durable attempts of one record before quarantine (``--max-attempts``)

    def check(self) -> None:
        """Raise ``ConfigError`` naming the first invalid flag."""
        if self.initial_ms < 1:
            raise ConfigError(f"--retry-initial-ms must be >= 1 (got {self.initial_ms})")
        if self.max_ms < self.initial_ms:
            raise ConfigError(f"--retry-max-ms must be >= --retry-initial-ms (got {self.max_ms})")
        if self.retry_max_attempts < 1:
            raise ConfigError("--retry-max-attempts must be >= 1 "
                              f"(got {self.retry_max_attempts})")
        if self.max_attempts < 1:
            raise ConfigError(f"--max-attempts must be >= 1 (got {self.max_attempts})")

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based): tenacity's exponential
        schedule, jittered by the injected ``rng`` (tenacity's own jitter draws from the
        global ``random``)."""
        schedule = wait_exponential(multiplier=self.initial_ms / 1000.0,
                                    max=self.max_ms / 1000.0)
        base_s = schedule(cast(RetryCallState, _Attempt(max(1, attempt))))
        return base_s * (0.5 + 0.5 * rng.random())


@dataclass(frozen=True, slots=True)
class _Attempt:
    """The one field of tenacity's ``RetryCallState`` that ``wait_exponential`` reads."""

    attempt_number: int


@dataclass(frozen=True, slots=True)
class Attempts:
    """The durable failure marks of a partition at its frontier, read when it is claimed."""

    unclean: bool = False  # the previous epoch ended without release/retire (a death)
    count: int = 0  # durable attempts recorded for the frontier offset (retries included)
    last_error: str | None = None
    alone: int = 0  # of which attempts of the record alone, process-wide (deaths blamed)
    uncertain_to: int | None = None  # an intent from the frontier to here never committed

    @property
    def suspect(self) -> bool:
        return self.unclean or self.count > 0

    @property
    def marked(self) -> bool:
        """Anything for the failure handling to act on."""
        return self.suspect or self.uncertain_to is not None


def death_reason(count: int, last_error: str | None) -> str:
    """Quarantine reason of a record whose ``count`` attempts alone never completed: each
    time it was the only record in flight, so each death was its."""
    tail = f"; last handler error: {last_error}" if last_error else ""
    return (f"quarantined after {count} attempts that did not complete, each with it alone "
            f"in flight (the process died during each: it killed the process){tail}")


def unknown_reason(why: str) -> str:
    """Quarantine reason of an ``outcome-uncertain`` record that is never run again."""
    return f"outcome unknown: {why}; an outcome-uncertain effect is never run again"


def too_slow_reason(limit_s: float, settings: str) -> str:
    """Quarantine reason of a record whose handler alone outlived ``limit_s``."""
    return (f"too slow: the handler took longer than {limit_s:g} s for this record alone "
            f"({settings})")


def max_probes(n: int) -> int:
    """Most probe transactions ``Bisection`` spends per poison record in a batch of ``n``."""
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


@dataclass(frozen=True, slots=True)
class Probe:
    """One transaction of a bisection: records ``[start, end)`` of the batch, of which the
    indices in ``reject`` are quarantined and the rest applied by the handler."""

    start: int
    end: int
    reject: tuple[int, ...]
    bisecting: bool  # a probe of a known-bad range (counted against the bound)


@dataclass(slots=True)
class Bisection:
    """The plan over a failed batch of ``n`` records (see the module Rules)."""

    n: int
    lo: int = 0  # first index not yet committed (carried rejects excluded)
    bad_hi: int | None = None  # [lo, bad_hi) holds a failure; None: unknown
    carry: list[int] = field(default_factory=list)
    probes: int = 0  # bisecting probes so far
    poison: list[int] = field(default_factory=list)
    _current: Probe | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("bisection of an empty batch")
        self.bad_hi = self.n  # the whole batch just failed

    def next(self) -> Probe | None:
        """The next transaction to run, or None when every record is committed."""
        while self.bad_hi is not None and self.bad_hi - self.lo == 1:
            self.carry.append(self.lo)
            self.poison.append(self.lo)
            self.lo += 1
            self.bad_hi = None
        start = self.carry[0] if self.carry else self.lo
        if self.bad_hi is None:
            if self.lo >= self.n and not self.carry:
                return None
            self._current = Probe(start, self.n, tuple(self.carry), bisecting=False)
        else:
            mid = self.lo + (self.bad_hi - self.lo) // 2
            self.probes += 1
            self._current = Probe(start, mid, tuple(self.carry), bisecting=True)
        return self._current

    def committed(self) -> None:
        """The current probe committed."""
        probe = self._require()
        self.carry.clear()
        self.lo = probe.end
        if not probe.bisecting:
            self.bad_hi = None
            self.lo = self.n

    def failed(self) -> None:
        """The current probe failed in the handler (nothing of it applied)."""
        probe = self._require()
        self.bad_hi = probe.end
        if self.bad_hi <= self.lo:
            raise AssertionError(f"a probe without records to apply failed: {probe}")

    def _require(self) -> Probe:
        if self._current is None:
            raise AssertionError("no probe in progress")
        probe, self._current = self._current, None
        return probe
