"""One small error tree. Every error the fence raises derives from FenceError.

Foreign errors (asyncpg, OSError, KafkaError) are translated at the adapter
boundary with ``raise ... from exc`` and never reach the lifecycle.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "FenceError",
    "Fenced",
    "HandlerDeclarationError",
    "NotCommitted",
    "OutcomeUnknown",
    "ReadFailed",
    "RecreatedTopic",
    "RetentionGap",
    "Retired",
    "SchemaMismatch",
    "SourceRefused",
    "StoreUnavailable",
]


class FenceError(Exception):
    """Root of every error fenceworker raises on purpose."""


class Fenced(FenceError):
    """Ownership moved: a newer epoch or another frontier is installed (nobody's fault)."""


class StoreUnavailable(FenceError):
    """The store was unreachable or failed transiently (the world's fault); retryable."""


class NotCommitted(StoreUnavailable):
    """A mutation provably did not commit (before COMMIT, or rolled back); safe to retry."""


class ReadFailed(StoreUnavailable):
    """A read-only store call failed; it changed nothing and is safe to retry."""


class OutcomeUnknown(FenceError):
    """COMMIT (or the claim) may have reached the server; its reply was lost (the world's fault)."""


class Retired(FenceError):
    """This lifetime stopped or retired; every later call is refused without I/O (the caller's)."""


class SourceRefused(FenceError):
    """Kafka no longer matches the durable state; an operator decides (see the runbook)."""


class RecreatedTopic(SourceRefused):
    """The topic's Kafka id differs from the one recorded: it was deleted and recreated."""


class RetentionGap(SourceRefused):
    """The durable frontier is below the low watermark: records were deleted unprocessed."""


class SchemaMismatch(FenceError):
    """The schema version is not the one this build knows (the operator's: `fencectl migrate`).

    ``migrate`` is True when migrating would fix it (missing or older schema)."""

    def __init__(self, message: str, *, migrate: bool = False) -> None:
        super().__init__(message)
        self.migrate = migrate


class HandlerDeclarationError(FenceError, ValueError):
    """A handler's durability class and effect semantics are incoherent (the developer's)."""


class ConfigError(FenceError, ValueError):
    """Invalid configuration; the message names the setting to fix (the operator's fault)."""
