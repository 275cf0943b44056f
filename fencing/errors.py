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
    """Ownership moved: another lifetime holds a newer epoch or moved the frontier (nobody's fault)."""


class StoreUnavailable(FenceError):
    """The store could not be reached or answered with a transient error (the world's fault); retryable."""


class NotCommitted(StoreUnavailable):
    """A mutation provably did not commit (failed before COMMIT was sent, or rolled back); safe to retry."""


class ReadFailed(StoreUnavailable):
    """A read-only store call failed; it changed nothing and is safe to retry."""


class OutcomeUnknown(FenceError):
    """COMMIT (or a claim's single statement) may have reached the server and its reply was lost; resolve by observing."""


class Retired(FenceError):
    """This lifetime was stopped or retired; it rejects every later call without I/O (the caller's misuse)."""


class SourceRefused(FenceError):
    """The Kafka source no longer matches the durable state; an operator must decide (see the runbook)."""


class RecreatedTopic(SourceRefused):
    """The topic's identity differs from the one recorded at first claim: it was deleted and recreated."""


class RetentionGap(SourceRefused):
    """The durable frontier is below the partition's low watermark: records were deleted before processing."""


class SchemaMismatch(FenceError):
    """The database schema version is not the one this build knows (the operator's fault: run `fencectl migrate`)."""


class HandlerDeclarationError(FenceError, ValueError):
    """A handler's declared durability class and effect semantics are incoherent (the developer's fault)."""


class ConfigError(FenceError, ValueError):
    """Invalid configuration; the message names the setting to fix (the operator's fault)."""
