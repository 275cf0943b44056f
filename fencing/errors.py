"""One small error tree. Every error the fence raises derives from FenceError.

Foreign errors (asyncpg, OSError, KafkaError) are translated at the adapter
boundary with ``raise ... from exc`` and never reach the lifecycle. Mapping an error to
an exit code (``consumer.exits``) needs nothing but this module.
"""

from __future__ import annotations

__all__ = [
    "BudgetExceeded",
    "ConfigError",
    "EffectUncertain",
    "FenceError",
    "Fenced",
    "HandlerDeclarationError",
    "HandlerFailed",
    "HandlerMisuse",
    "InstanceFenced",
    "KafkaClientFailed",
    "NotCommitted",
    "OutcomeUnknown",
    "ReadFailed",
    "RecreatedTopic",
    "ResetByOperator",
    "RetentionGap",
    "Retired",
    "SchemaMismatch",
    "SourceRefused",
    "SourceUnavailable",
    "StatementRejected",
    "StoreUnavailable",
    "TokenDropped",
    "TooSlow",
    "Transient",
    "Unavailable",
    "Unresolved",
]


class FenceError(Exception):
    """Root of every error fenceworker raises on purpose."""


class Fenced(FenceError):
    """Ownership moved: a newer epoch or another frontier is installed (nobody's fault)."""


class TokenDropped(Fenced):
    """The partition's token was dropped (its assignment lost or revoked) while the call
    waited for its turn: nothing was sent, so nothing says another owner committed."""


class ResetByOperator(Fenced):
    """An operator's ``fencectl reset`` installed a newer epoch on a partition this lifetime
    holds, and no member claimed it since: nothing of the call was applied; the lifetime
    stays live and claims the partition again, from the operator's frontier (the
    operator's)."""


class InstanceFenced(Fenced):
    """Another process joined the group with this member's static ``--instance-id``; Kafka
    fenced this one (the operator's: every running member needs its own id). Its lifetime
    ends and is not restarted in-process: a fresh lifetime would fence the other one."""


class StoreUnavailable(FenceError):
    """The store was unreachable or failed transiently (the world's fault); retryable."""


class NotCommitted(StoreUnavailable):
    """A mutation provably did not commit (before COMMIT, or rolled back); safe to retry."""


class ReadFailed(StoreUnavailable):
    """A read-only store call failed; it changed nothing and is safe to retry."""


class OutcomeUnknown(FenceError):
    """COMMIT (or the claim) may have reached the server; its reply was lost (the world's fault)."""


class StatementRejected(FenceError):
    """PostgreSQL refused a statement for a reason no retry can fix (undefined table or
    column, syntax, permission, a constraint): ``sqlstate`` says which (the developer's or
    the operator's). Nothing of the transaction was applied."""

    def __init__(self, message: str, *, sqlstate: str = "") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class HandlerMisuse(FenceError):
    """The handler broke the store's transaction: it caught a PostgreSQL error without a
    SAVEPOINT (COMMIT was answered with ROLLBACK) or ended the transaction itself. The batch
    is not reported applied (the developer's)."""


class Transient(Exception):
    """Raised by a handler (or set as the ``__cause__`` of what it raises) to say a retry may
    succeed: the batch is rolled back and retried with backoff (the world's)."""


class Unavailable(Transient):
    """Raised by a handler when a service it needs does not answer (e.g. the schema registry):
    the batch is rolled back and retried with backoff until the service answers, never
    bisected, and the attempts are not counted against its records (the world's)."""


class HandlerFailed(FenceError):
    """The handler raised while applying a batch: the transaction rolled back, nothing of
    the batch applied, the lifetime stays live. ``transient``: a retry may succeed (a
    ``Transient``, serialization failure, deadlock, lock timeout); otherwise
    the batch holds a poison record (the handler's or its input's). ``unavailable``: an
    ``Unavailable`` (retried until the service answers)."""

    def __init__(self, message: str, *, transient: bool, error_type: str,
                 error_message: str, traceback_digest: str, unavailable: bool = False) -> None:
        super().__init__(message)
        self.transient = transient or unavailable
        self.unavailable = unavailable
        self.error_type = error_type
        self.error_message = error_message
        self.traceback_digest = traceback_digest


class TooSlow(HandlerFailed):
    """The handler outlived its share of the call budget or of the session's
    idle-in-transaction timeout and was stopped: the transaction rolled back (the batch is
    split; the handler's, or its downstream's)."""

    def __init__(self, message: str, *, limit_s: float) -> None:
        super().__init__(message, transient=False, error_type="TooSlow",
                         error_message=message, traceback_digest="")
        self.limit_s = limit_s


class EffectUncertain(HandlerFailed):
    """An ``outcome-uncertain`` handler ran but its batch did not commit (a lost or refused
    COMMIT, a store retry that would run it again): its external effects may or may not
    have happened, so its records are never run again (the world's)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False, error_type="OutcomeUnknown",
                         error_message=message, traceback_digest="")


class SourceUnavailable(FenceError):
    """Kafka did not answer a metadata or offsets request (the world's fault); retry later."""


class KafkaClientFailed(SourceUnavailable):
    """The Kafka client could not carry out a rebalance step (e.g. ``assign`` failed inside
    the assignment callback); the lifetime fail-stops instead of letting librdkafka position
    the consumer by itself (the world's or librdkafka's)."""


class Unresolved(OutcomeUnknown):
    """An unknown outcome could not be resolved within the re-read's three calls; the lifetime
    retires (the world's fault)."""


class BudgetExceeded(FenceError):
    """A guarded lifecycle call used up its budget, counted from before the mutex wait (the
    world's: a slow store or handler)."""


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
