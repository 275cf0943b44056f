"""The handler API: one async callable, given the transaction's connection and the batch,
returning ``Accept`` or ``Reject(reason)`` per record, in order.

Rules

- A handler declares its durability class and effect semantics with ``@handler(...)``;
  undeclared handlers are ``durable-critical`` + ``transactional``.
- Exactly-once effects exist only for ``transactional`` effects (written through the
  given connection). Durability ``durable-critical`` | ``derived-reconcilable`` |
  ``best-effort``; effects ``transactional`` | ``idempotent-or-observable`` |
  ``outcome-uncertain`` | ``convergent`` | ``loss-tolerant``. ``INCOHERENT`` lists the pairs
  refused at start with their reason (``loss-tolerant`` requires ``best-effort``;
  ``derived-reconcilable`` cannot be ``outcome-uncertain``). A ``best-effort`` handler's
  frontier never claims completeness (``Declaration.claims_completeness``: status and
  metrics say so).
  ``@handler(...)`` only records what was declared (so importing a module never fails
  because of one handler, and its other handlers still load); ``declaration_of`` /
  ``load_handler`` check it and name the handler and the pair.
- ``on_failure``: ``quarantine`` (default: poison records are isolated and quarantined) or
  ``stop`` (a failure that survives its retries fail-stops the lifetime, exit 1).
  ``outcome-uncertain`` handlers are never replayed after a failure (``consumer.failure_run``).
- A handler marks an exception transient by raising ``Transient`` (or one caused by it);
  ``Unavailable`` (a ``Transient``) says a service it needs does not answer: retried until it
  does, never bisected (``consumer.failure_run``).
- A handler must return exactly one verdict per record; anything else raises
  ``HandlerDeclarationError`` inside the transaction, which then rolls back.
- ``--handler module:name`` names a handler or a *factory*: a callable marked with
  ``@handler_factory(...)`` that is given a ``HandlerContext`` (schema, group, topics,
  settings) and returns the handler. A factory may bring ``ensure_tables(conn, context)``,
  run once at start before any batch, under a session advisory lock per schema (members
  starting together run their set-ups one after another). Nothing is read from the
  environment and no handler name is special: the reference handler is a factory like
  any user's.

Long because the API's docstrings here are its reference page (docs/api.md).
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fencing.errors import ConfigError, HandlerDeclarationError, Transient, Unavailable
from fencing.importing import import_module_of
from fencing.store import HandlerFn
from fencing.types import ACCEPT, Accept, Reject, Verdict

__all__ = [
    "ENSURE_LOCK_PREFIX",
    "INCOHERENT",
    "Declaration",
    "Durability",
    "Effects",
    "HandlerContext",
    "LoadedHandler",
    "OnFailure",
    "Transient",
    "Unavailable",
    "accepted_all",
    "build_from",
    "build_handler",
    "check_verdicts",
    "declaration_of",
    "handler",
    "handler_factory",
    "load_handler",
]


class Durability(enum.Enum):
    """How much losing an effect matters."""

    DURABLE_CRITICAL = "durable-critical"  # losing or doubling it is an incident
    DERIVED_RECONCILABLE = "derived-reconcilable"  # derived data, rebuilt from the source
    BEST_EFFORT = "best-effort"  # may be dropped after its attempts


class Effects(enum.Enum):
    """What the handler's effects are like when a batch is replayed."""

    TRANSACTIONAL = "transactional"  # only through the given connection: exactly once
    IDEMPOTENT_OR_OBSERVABLE = "idempotent-or-observable"  # a replay is harmless or detected
    OUTCOME_UNCERTAIN = "outcome-uncertain"  # after a failure, whether it happened is unknown
    CONVERGENT = "convergent"  # replays converge to the same state (upserts, max, sets)
    LOSS_TOLERANT = "loss-tolerant"  # may be lost without harm


class OnFailure(enum.Enum):
    """What a failure that survives its retries does (``@handler(on_failure=...)``)."""

    QUARANTINE = "quarantine"
    STOP = "stop"


#: the refused (durability, effects) pairs and why; every other pair of the 15 is coherent
INCOHERENT: dict[tuple[Durability, Effects], str] = {
    (Durability.DURABLE_CRITICAL, Effects.LOSS_TOLERANT):
        "loss-tolerant effects require best-effort durability: a durable-critical effect "
        "must never be lost",
    (Durability.DERIVED_RECONCILABLE, Effects.LOSS_TOLERANT):
        "loss-tolerant effects require best-effort durability: a derived-reconcilable "
        "effect is reconciled, not lost",
    (Durability.DERIVED_RECONCILABLE, Effects.OUTCOME_UNCERTAIN):
        "a derived-reconcilable effect converges when its records are applied again, but an "
        "outcome-uncertain effect is never applied again (its records are quarantined): "
        "declare its effects convergent or idempotent-or-observable, or its durability "
        "durable-critical",
}


@dataclass(frozen=True, slots=True)
class Declaration:
    """A handler's checked declaration (``@handler(...)``; undeclared: the defaults)."""

    durability: Durability = Durability.DURABLE_CRITICAL
    effects: Effects = Effects.TRANSACTIONAL
    on_failure: OnFailure = OnFailure.QUARANTINE

    @property
    def claims_completeness(self) -> bool:
        """Whether a frontier means "every record below it applied or quarantined": never
        for ``best-effort``, whose effects may be dropped after the frontier moved."""
        return self.durability is not Durability.BEST_EFFORT

    def as_dict(self) -> dict[str, str]:
        """The declaration as its three values (member rows, metrics)."""
        return {"durability": self.durability.value, "effects": self.effects.value,
                "on_failure": self.on_failure.value}

    def check(self) -> None:
        """Raise ``HandlerDeclarationError`` when the pair is incoherent (``INCOHERENT``)."""
        reason = INCOHERENT.get((self.durability, self.effects))
        if reason is not None:
            raise HandlerDeclarationError(reason)


_ATTR = "__fence_declaration__"
_VERDICT_TYPES = (Accept, Reject)


@dataclass(frozen=True, slots=True)
class _Declared:
    """What ``@handler(...)`` was given, unchecked until the handler is loaded."""

    durability: str
    effects: str
    on_failure: str = "quarantine"

    def parse(self) -> Declaration:
        """The checked ``Declaration``; raises ``HandlerDeclarationError`` naming the pair."""
        try:
            decl = Declaration(Durability(self.durability), Effects(self.effects),
                               OnFailure(self.on_failure))
        except ValueError as exc:
            raise HandlerDeclarationError(
                f"{exc}: use durability {' | '.join(d.value for d in Durability)}, effects "
                f"{' | '.join(e.value for e in Effects)} and on_failure "
                f"{' | '.join(o.value for o in OnFailure)}") from exc
        try:
            decl.check()
        except HandlerDeclarationError as exc:
            raise HandlerDeclarationError(
                f"declared durability={self.durability} effects={self.effects}: {exc}") from exc
        return decl


def handler(
    *, durability: str = "durable-critical", effects: str = "transactional",
    on_failure: str = "quarantine",
) -> Callable[[HandlerFn], HandlerFn]:
    """Declare a handler's durability class, effect semantics and failure behaviour.

    Never raises: an incoherent or unknown pair is refused when the handler is loaded
    (``declaration_of``, ``load_handler``), not when its module is imported."""
    declared = _Declared(durability, effects, on_failure)

    def mark(fn: HandlerFn) -> HandlerFn:
        setattr(fn, _ATTR, declared)
        return fn

    return mark


def declaration_of(fn: HandlerFn) -> Declaration:
    """The handler's checked declaration (the default when undeclared); raises
    ``HandlerDeclarationError`` for an unknown or incoherent pair."""
    decl = getattr(fn, _ATTR, Declaration())
    if isinstance(decl, _Declared):
        return decl.parse()
    if not isinstance(decl, Declaration):
        raise HandlerDeclarationError(f"{_ATTR} of {fn!r} is not a Declaration")
    decl.check()
    return decl


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """What a handler factory is given when ``fencectl run`` starts."""

    schema: str
    """The PostgreSQL schema of the fence tables (``--schema``)."""
    group_id: str
    """The consumer group (``--group``)."""
    topics: tuple[str, ...]
    """The ``--topic`` names (a ``--topic-pattern``'s topics are not known up front)."""
    settings: Mapping[str, str] = field(default_factory=dict)
    """The ``--handler-setting KEY=VALUE`` pairs."""


EnsureTables = Callable[[Any, HandlerContext], Awaitable[None]]
F = TypeVar("F", bound=Callable[..., Any])
_FACTORY = "__fence_factory__"
#: the session advisory lock (``hashtext`` of this + the schema) a factory's
#: ``ensure_tables`` runs under, so members starting together never race the catalog
ENSURE_LOCK_PREFIX = "fenceworker.ensure_tables:"


@dataclass(frozen=True, slots=True)
class _Factory:
    ensure_tables: EnsureTables | None


@dataclass(frozen=True, slots=True)
class LoadedHandler:
    """A checked handler and, for a factory that has one, its table set-up."""

    fn: HandlerFn
    ensure_tables: Callable[[Any], Awaitable[None]] | None = None


def handler_factory(*, ensure_tables: EnsureTables | None = None) -> Callable[[F], F]:
    """Mark ``build(context) -> handler`` as a handler factory: ``--handler module:name``
    calls it once with the run's ``HandlerContext`` and runs the handler it returns.
    ``ensure_tables(conn, context)``, when given, runs once at start before any batch,
    under a session advisory lock per schema (members starting together run it one after
    another)."""
    def mark(build: F) -> F:
        setattr(build, _FACTORY, _Factory(ensure_tables))
        return build
    return mark


def _resolve(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--handler {spec!r}: expected module:callable")
    module = import_module_of(spec, module_name)
    target: Any = getattr(module, attr, None)
    if target is None or not callable(target):
        raise ConfigError(f"--handler {spec!r}: {module_name!r} has no callable {attr!r}")
    return target


def _checked(spec: str, fn: Any) -> HandlerFn:
    if not callable(fn):
        raise ConfigError(f"--handler {spec}: the factory returned {fn!r}, not a handler")
    try:
        declaration_of(fn)
    except HandlerDeclarationError as exc:
        raise ConfigError(f"--handler {spec}: refused: {exc}") from exc
    return fn  # type: ignore[no-any-return,unused-ignore]


def load_handler(spec: str) -> HandlerFn:
    """Import the handler ``module:callable`` and check its declaration; raises
    ``ConfigError`` (also for a factory: use ``build_handler``)."""
    target = _resolve(spec)
    if getattr(target, _FACTORY, None) is not None:
        raise ConfigError(f"--handler {spec}: is a handler factory; build it with a context")
    return _checked(spec, target)


def build_handler(spec: str, context: HandlerContext) -> LoadedHandler:
    """The handler ``spec`` names: a handler as it is, or what its factory builds for
    ``context``; its declaration checked. Raises ``ConfigError`` naming ``--handler``."""
    return build_from(_resolve(spec), context, label=spec)


def build_from(target: Any, context: HandlerContext, *, label: str) -> LoadedHandler:
    """``target`` (a handler, or a ``@handler_factory``) as ``build_handler`` loads it;
    ``label`` names it in a ``ConfigError``."""
    factory = getattr(target, _FACTORY, None)
    if not isinstance(factory, _Factory):
        return LoadedHandler(_checked(label, target))
    fn = _checked(label, target(context))
    ensure = factory.ensure_tables
    if ensure is None:
        return LoadedHandler(fn)

    async def ensure_tables(conn: Any) -> None:
        # Members of a group start together, and PostgreSQL's CREATE ... IF NOT EXISTS is
        # not safe against a concurrent creator: the loser fails on a catalog unique index
        # ("pg_type_typname_nsp_index"; seen in CI with two members, reproduced with four
        # connections: 89 of 120 failed). One session lock per schema serializes the set-ups;
        # any role may take it, and closing the connection releases it whatever happened.
        lock = f"{ENSURE_LOCK_PREFIX}{context.schema}"
        await conn.execute("SELECT pg_advisory_lock(hashtext($1))", lock)
        try:
            await ensure(conn, context)
        finally:
            if not conn.is_closed():
                with contextlib.suppress(Exception):  # a failed set-up's error is the one
                    await conn.execute("SELECT pg_advisory_unlock(hashtext($1))", lock)

    return LoadedHandler(fn, ensure_tables)


def _all_accept(verdicts: Sequence[Verdict], count: int) -> bool:
    # hot path (every batch): ACCEPT counted in C (identity first), no Python loop
    return len(verdicts) == count and verdicts.count(ACCEPT) == count


def accepted_all(verdicts: Sequence[Verdict], count: int) -> bool:
    """``check_verdicts``, then whether every verdict is ACCEPT (one count for both)."""
    if _all_accept(verdicts, count):
        return True
    check_verdicts(verdicts, count)
    return False


def check_verdicts(verdicts: Sequence[Verdict], count: int) -> Sequence[Verdict]:
    """Return ``verdicts`` when it holds exactly ``count`` Accept/Reject values; raise otherwise."""
    if _all_accept(verdicts, count):
        return verdicts
    if len(verdicts) != count or not all(
        v is ACCEPT or isinstance(v, _VERDICT_TYPES) for v in verdicts
    ):
        raise HandlerDeclarationError(
            f"handler returned {len(verdicts)} verdicts for {count} records; "
            "expected one Accept or Reject per record"
        )
    return verdicts
