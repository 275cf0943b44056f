"""The handler API: one async callable, given the transaction's connection and the batch,
returning ``Accept`` or ``Reject(reason)`` per record, in order.

Rules
- A handler declares its durability class and effect semantics with ``@handler(...)``;
  undeclared handlers are ``durable-critical`` + ``transactional``.
- Exactly-once effects exist only for ``transactional`` effects (written through the
  given connection). ``durable-critical`` with ``external-non-idempotent`` effects is
  incoherent (a replay after a lost COMMIT would repeat the external effect) and is
  refused at start: ``@handler(...)`` only records what was declared (so importing a module
  never fails because of one handler, and its other handlers still load);
  ``declaration_of`` / ``load_handler`` check it and name the handler and the pair.
- A handler must return exactly one verdict per record; anything else raises
  ``HandlerDeclarationError`` inside the transaction, which then rolls back.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fencing.errors import ConfigError, HandlerDeclarationError
from fencing.store import HandlerFn
from fencing.types import ACCEPT, Accept, Reject, Verdict

__all__ = [
    "Declaration",
    "Durability",
    "Effects",
    "check_verdicts",
    "declaration_of",
    "handler",
    "load_handler",
]


class Durability(enum.Enum):
    """How much losing an effect matters."""

    DURABLE_CRITICAL = "durable-critical"
    BEST_EFFORT = "best-effort"


class Effects(enum.Enum):
    """Where the handler's effects land."""

    TRANSACTIONAL = (
        "transactional"  # only through the given connection, inside the fenced transaction
    )
    EXTERNAL_IDEMPOTENT = "external-idempotent"  # outside the transaction, safe to repeat
    EXTERNAL_NON_IDEMPOTENT = (
        "external-non-idempotent"  # outside the transaction, not safe to repeat
    )


@dataclass(frozen=True, slots=True)
class Declaration:
    durability: Durability = Durability.DURABLE_CRITICAL
    effects: Effects = Effects.TRANSACTIONAL

    def check(self) -> None:
        """Raise ``HandlerDeclarationError`` when the pair is incoherent."""
        if (
            self.durability is Durability.DURABLE_CRITICAL
            and self.effects is Effects.EXTERNAL_NON_IDEMPOTENT
        ):
            raise HandlerDeclarationError(
                "durable-critical handlers cannot have external-non-idempotent effects: a lost "
                "COMMIT replays the batch and would repeat them; write effects through the "
                "given connection (transactional) or make them idempotent"
            )


_ATTR = "__fence_declaration__"
_VERDICT_TYPES = (Accept, Reject)


@dataclass(frozen=True, slots=True)
class _Declared:
    """What ``@handler(...)`` was given, unchecked until the handler is loaded."""

    durability: str
    effects: str

    def parse(self) -> Declaration:
        """The checked ``Declaration``; raises ``HandlerDeclarationError`` naming the pair."""
        try:
            decl = Declaration(Durability(self.durability), Effects(self.effects))
        except ValueError as exc:
            raise HandlerDeclarationError(
                f"{exc}: use durability {' | '.join(d.value for d in Durability)} and effects "
                f"{' | '.join(e.value for e in Effects)}") from exc
        try:
            decl.check()
        except HandlerDeclarationError as exc:
            raise HandlerDeclarationError(
                f"declared durability={self.durability} effects={self.effects}: {exc}") from exc
        return decl


def handler(
    *, durability: str = "durable-critical", effects: str = "transactional"
) -> Callable[[HandlerFn], HandlerFn]:
    """Declare a handler's durability class and effect semantics.

    Never raises: an incoherent or unknown pair is refused when the handler is loaded
    (``declaration_of``, ``load_handler``), not when its module is imported."""
    declared = _Declared(durability, effects)

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


def load_handler(spec: str) -> HandlerFn:
    """Import ``module:callable`` and check its declaration; raises ``ConfigError``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--handler {spec!r}: expected module:callable")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--handler {spec!r}: cannot import {module_name!r}: {exc}") from exc
    fn: Any = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ConfigError(f"--handler {spec!r}: {module_name!r} has no callable {attr!r}")
    try:
        declaration_of(fn)
    except HandlerDeclarationError as exc:
        raise ConfigError(f"--handler {spec}: refused: {exc}") from exc
    return fn  # type: ignore[no-any-return,unused-ignore]


def check_verdicts(verdicts: Sequence[Verdict], count: int) -> Sequence[Verdict]:
    """Return ``verdicts`` when it holds exactly ``count`` Accept/Reject values; raise otherwise."""
    # hot path (every batch): the ACCEPT singleton short-circuits the type check
    if len(verdicts) != count or not all(
        v is ACCEPT or isinstance(v, _VERDICT_TYPES) for v in verdicts
    ):
        raise HandlerDeclarationError(
            f"handler returned {len(verdicts)} verdicts for {count} records; "
            "expected one Accept or Reject per record"
        )
    return verdicts
