"""Worker configuration: flags + environment -> one frozen ``WorkerConfig``; librdkafka settings.

Long because every setting, its default, its reason and its check live here, the one place
an operator's flag name leads to.

Rules
- Every setting has one name an operator can search for (the flag or the env var); a
  ``ConfigError`` message names it.
- librdkafka properties pass through ``-X key=value`` (as kcat does) except the ones the
  worker owns: offsets are committed by the worker after each PostgreSQL commit and the
  consumer is always positioned explicitly, so ``enable.auto.commit=true``,
  ``enable.auto.offset.store=true``, ``group.id`` and ``bootstrap.servers`` given twice
  with different values, and a ``group.protocol`` that contradicts ``--group-protocol`` are
  refused.
- With ``group.protocol=consumer`` (KIP-848) the group timeouts and the assignor live on
  the broker: librdkafka refuses ``session.timeout.ms``, ``heartbeat.interval.ms``,
  ``partition.assignment.strategy`` and ``group.protocol.type`` at construction, so the
  worker refuses them first with a message naming the setting.
- ``auto.offset.reset`` given to librdkafka is always ``error``: a position that falls out
  of range (retention deleted records mid-consumption) must surface as an error, never as
  a silent jump. The operator's ``auto.offset.reset`` only chooses the initial frontier of
  a partition the store has never seen.
- The DSN is a secret: it is read from the environment only and every rendering of it goes
  through ``redact_dsn``.
"""

from __future__ import annotations

import enum
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from consumer.decisions import AUTO_OFFSET_RESETS
from consumer.outage import DEFAULT_BOUND_S
from fencing.errors import ConfigError
from fencing.failures import RetryPolicy

__all__ = [
    "DEFAULT_ASSIGNMENT_STRATEGY",
    "DEFAULT_BATCH_LINGER_S",
    "DEFAULT_BATCH_MAX_RECORDS",
    "KAFKA_CONFIG_ENV",
    "PREFETCH",
    "GroupProtocol",
    "WorkerConfig",
    "check_topic_pattern",
    "client_properties",
    "kafka_settings",
    "parse_x_options",
    "redact",
    "redact_dsn",
]

DEFAULT_BATCH_MAX_RECORDS = 500  # --sink's own: ops.commands.run.SINK_BATCH_MAX_RECORDS
DEFAULT_ASSIGNMENT_STRATEGY = "cooperative-sticky"
DEFAULT_BATCH_LINGER_S = 0.005
#: librdkafka's prefetch: at most 4 MiB over all partitions, and once there, the next fetch
#: 10 ms later (its default, 1 s, starved the worker of records; docs/benchmarks.md)
PREFETCH = {"queued.max.messages.kbytes": "4096", "fetch.queue.backoff.ms": "10"}

_OWNED_FALSE = ("enable.auto.commit", "enable.auto.offset.store")
_KIP848_FORBIDDEN = (
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "group.protocol.type",
)
_EAGER = frozenset({"range", "roundrobin"})
_COOPERATIVE = frozenset({"cooperative-sticky"})


class GroupProtocol(enum.Enum):
    """The consumer-group protocol: classic (eager or cooperative assignors) or KIP-848."""

    CLASSIC = "classic"
    CONSUMER = "consumer"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """Everything ``fencectl run`` needs; built by ``ops.commands.run`` and checked by ``check``."""

    topics: tuple[str, ...] = ()
    """Kafka topics to consume by name (``--topic``, repeatable)."""
    topic_pattern: str | None = None
    """Also every topic whose name matches this regex (``--topic-pattern``), including topics
    created later: librdkafka subscribes to it as ``^<pattern>`` and re-matches on every
    metadata refresh (``topic.metadata.refresh.interval.ms``, default 300000 ms)."""
    group_id: str
    """Consumer group id; also keys the PostgreSQL rows (``--group``)."""
    bootstrap_servers: str
    """Kafka bootstrap servers (``KAFKA_BOOTSTRAP_SERVERS`` or ``--bootstrap-servers``)."""
    bootstrap_source: str = "KAFKA_BOOTSTRAP_SERVERS"
    """Where ``bootstrap_servers`` came from, for messages: the flag or the env variable."""
    dsn: str = field(repr=False)
    """PostgreSQL DSN (``FENCE_DSN``; never a flag, never logged)."""
    handler: str
    """Effect handler or handler factory as ``module:name`` (``--handler``; no default here:
    the command that builds the config chooses it, ``fencectl run`` the reference handler)."""
    schema: str = "fence"
    """PostgreSQL schema of the fence tables and the reference effect tables (``--schema``)."""
    group_protocol: GroupProtocol = GroupProtocol.CLASSIC
    """``--group-protocol classic|consumer`` (default classic)."""
    assignment_strategy: str | None = None
    """Classic-protocol assignor (``--assignment-strategy``); None: cooperative-sticky with
    the classic protocol. With ``--group-protocol consumer`` the broker assigns, so any value
    is refused."""
    auto_offset_reset: str = "earliest"
    """Initial frontier of a partition the store has never seen: earliest|latest."""
    batch_max_records: int = DEFAULT_BATCH_MAX_RECORDS
    """Most records in one transaction (``--batch-max-records``, default 500; 2000 with --sink)."""
    batch_max_bytes: int = 1 << 20
    """Most key+value bytes in one transaction (``--batch-max-bytes``, default 1 MiB)."""
    batch_linger_s: float = DEFAULT_BATCH_LINGER_S
    """Longest a batch that is not full waits for more records after its oldest record
    arrived (``--batch-linger-ms``, default 5 ms, the Kafka producer's ``linger.ms``
    default; 0: never wait)."""
    queue_max_batches: int = 16
    """A partition is paused once this many full batches wait locally (default 16). Pausing
    makes librdkafka drop the partition's prefetched records and fetch them again on resume,
    so a small bound costs throughput under backlog (measured: 4 -> 16 took the benchmark
    from ~0.7 to ~1.0 of the unfenced baseline)."""
    db_concurrency: int = 4
    """Partitions processed concurrently; bounded by the store's pool (``--db-concurrency``)."""
    lanes: int = 1
    """Key-ordered lanes per partition (``--lanes``; 1: a partition's batches one at a
    time, in offset order). More: records of different keys run side by side, each key's
    in offset order (``fencing.lanes``)."""
    lanes_window: int = 10_000
    """Most offsets a partition's lanes run ahead of its frontier (``--lanes-window``); a
    full window pauses the partition, it never drops or replays."""
    lanes_null_any: bool = False
    """Records without a key go to any lane, round-robin by offset (``--lanes-null any``);
    default: all to one lane, in order."""
    shutdown_timeout_s: float = 15.0
    """Bound for finishing in-flight batches after SIGTERM/SIGINT (default 15 s)."""
    budget_s: float = 20.0
    """Budget of every guarded lifecycle call (assign, seek, process, revoke), counted from
    before the mutex wait; rebalance callbacks wait this plus a margin (``--call-budget-s``,
    default 20 s). A handler call may last 75 % of it (``fencing.slow.handler_limit_s``)."""
    poll_timeout_s: float = 0.05
    """Longest single consume() wait on the Kafka thread (default 50 ms)."""
    allow_retention_gap: bool = False
    """Skip a retention gap (journaled) instead of refusing the partition."""
    db_idle_in_transaction_timeout_s: float = 8.0
    """PostgreSQL ends a worker session idle inside a transaction this long (default 8 s): a
    stopped or hung zombie would otherwise hold its partition row lock and block the next
    owner's claim past the call budget. A handler call may last 90 % of it: a longer one
    is stopped and its batch split (``consumer.failure_run``)."""
    restart_lifetimes: int = 0
    """Fresh lifetimes to start after a retirement before exiting 3 (default 0)."""
    outage_bound_s: float = DEFAULT_BOUND_S
    """Seconds one episode of Kafka not answering (a broker, controller or coordinator
    failover), or of PostgreSQL not answering at start, is retried with backoff before the
    lifetime ends with exit 5 naming the service (``--outage-bound-s``, default 60;
    ``consumer.outage``)."""
    instance_id: str | None = None
    """Static group membership: librdkafka's ``group.instance.id`` (``--instance-id`` or
    ``FENCE_INSTANCE_ID``; default none). A restarted member with the same id gets its
    partitions back without a rebalance while the group still holds its membership (see
    docs/kafka-failures.md); each running member needs its own id."""
    x_options: Mapping[str, str] = field(default_factory=dict)
    """Extra librdkafka properties from ``-X key=value``."""
    handler_settings: Mapping[str, str] = field(default_factory=dict)
    """Settings for a handler factory from ``--handler-setting key=value`` (repeatable)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Handler failures: ``--retry-initial-ms`` (200), ``--retry-max-ms`` (10000),
    ``--retry-max-attempts`` (5) and ``--max-attempts`` (3) (``fencing.failures``)."""

    def check(self) -> None:
        """Raise ``ConfigError`` naming the first invalid setting."""
        if not self.topics and self.topic_pattern is None:
            raise ConfigError("--topic or --topic-pattern is required")
        for topic in self.topics:
            if not topic or topic.startswith("^"):
                raise ConfigError(f"--topic {topic!r}: a topic name (for a regex use "
                                  "--topic-pattern)")
        if self.topic_pattern is not None:
            check_topic_pattern(self.topic_pattern)
        if not self.group_id:
            raise ConfigError("--group is required")
        if not self.bootstrap_servers:
            raise ConfigError("KAFKA_BOOTSTRAP_SERVERS is not set and no --bootstrap-servers "
                              "given")
        if not self.dsn:
            raise ConfigError("FENCE_DSN is not set")
        for name, value in (("--batch-max-records", self.batch_max_records),
                            ("--batch-max-bytes", self.batch_max_bytes),
                            ("--queue-max-batches", self.queue_max_batches),
                            ("--db-concurrency", self.db_concurrency)):
            if value < 1:
                raise ConfigError(f"{name} must be >= 1 (got {value})")
        if self.lanes < 1 or self.lanes > 1024:
            raise ConfigError(f"--lanes must be 1..1024 (got {self.lanes})")
        if self.lanes_window < 1:
            raise ConfigError(f"--lanes-window must be >= 1 (got {self.lanes_window})")
        if self.budget_s <= 0:
            raise ConfigError(f"--call-budget-s must be > 0 (got {self.budget_s:g})")
        if not 0 <= self.batch_linger_s <= 1:
            raise ConfigError(f"--batch-linger-ms {self.batch_linger_s * 1000:g}: use 0..1000 "
                              "(how long a batch that is not full may wait for more records)")
        if self.shutdown_timeout_s <= 0:
            raise ConfigError(f"--shutdown-timeout-s must be > 0 (got {self.shutdown_timeout_s})")
        if not 0 < self.db_idle_in_transaction_timeout_s < self.budget_s:
            raise ConfigError(
                f"--db-idle-in-transaction-timeout-s {self.db_idle_in_transaction_timeout_s:g}: "
                f"use more than 0 and less than the {self.budget_s:g} s lifetime budget "
                "(--call-budget-s; a stopped member's open transaction must end before the "
                "next owner's claim gives up; default 8)")
        if self.restart_lifetimes < 0:
            raise ConfigError("--restart-lifetimes must be >= 0")
        if not self.outage_bound_s >= 0:
            raise ConfigError(f"--outage-bound-s must be >= 0 (got {self.outage_bound_s:g})")
        if self.instance_id is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,249}",
                                                             self.instance_id):
            raise ConfigError(f"--instance-id {self.instance_id!r}: use 1 to 249 letters, "
                              "digits, '.', '_' or '-' (e.g. the pod or host name)")
        if self.auto_offset_reset not in AUTO_OFFSET_RESETS:
            raise ConfigError(f"--auto-offset-reset must be earliest or latest, "
                              f"not {self.auto_offset_reset!r}")
        if self.group_protocol is GroupProtocol.CONSUMER and self.assignment_strategy is not None:
            raise ConfigError(
                f"--assignment-strategy {self.assignment_strategy} cannot be used with "
                "--group-protocol consumer (KIP-848: the broker assigns partitions); drop "
                "--assignment-strategy or use --group-protocol classic")
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", self.schema):
            raise ConfigError(f"--schema {self.schema!r} is not a lower-case SQL identifier "
                              "([a-z_][a-z0-9_]*)")
        self.retry.check()
        kafka_settings(self)  # raises on conflicting -X

    @property
    def subscription(self) -> list[str]:
        """What ``Consumer.subscribe`` is given: the topic names, then the pattern with the
        leading ``^`` that makes librdkafka read it as a regex."""
        names = list(dict.fromkeys(self.topics))
        if self.topic_pattern is not None:
            pattern = self.topic_pattern
            names.append(pattern if pattern.startswith("^") else "^" + pattern)
        return names

    @property
    def strategy(self) -> str:
        """The classic-protocol assignor in effect (``assignment_strategy`` or its default)."""
        return DEFAULT_ASSIGNMENT_STRATEGY if self.assignment_strategy is None else \
            self.assignment_strategy

    @property
    def cooperative(self) -> bool:
        """Incremental rebalancing: KIP-848 or a cooperative classic assignor."""
        return (self.group_protocol is GroupProtocol.CONSUMER
                or self.strategy.strip() in _COOPERATIVE)

    @property
    def queue_max_records(self) -> int:
        return self.batch_max_records * self.queue_max_batches

    @property
    def queue_max_bytes(self) -> int:
        return self.batch_max_bytes * self.queue_max_batches


# librdkafka matches a "^" subscription with POSIX extended regex (rdregex.c: regcomp with
# REG_EXTENDED where libc has it, else its bundled minilibs regexp): Perl class escapes are
# not ERE, so "\d" would silently match a literal "d" (seen: a worker subscribed to
# "^t-p\d+" got no partition of t-p1). Refused up front.
_PERL_CLASSES = re.compile(r"\\[dDwWsSbB]")


def check_topic_pattern(pattern: str) -> None:
    """Raise ``ConfigError`` naming ``--topic-pattern`` when ``pattern`` is not a regex both
    Python and librdkafka's POSIX extended regex read the same way; the message shows the
    pattern as a shell would take it back (``'orders-\\d+'``), not as a Python literal."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"--topic-pattern {shlex.quote(pattern)}: not a regular expression: "
                          f"{exc}") from None
    found = _PERL_CLASSES.search(pattern)
    if found:
        raise ConfigError(f"--topic-pattern {shlex.quote(pattern)}: {found.group()} is not "
                          "POSIX extended regex syntax, which librdkafka uses; write a bracket "
                          "expression such as [0-9] or [a-z0-9_]")


#: the file of librdkafka properties every command's Kafka clients take (TLS, SASL and
#: their secrets, which so never appear in argv)
KAFKA_CONFIG_ENV = "FENCE_KAFKA_CONFIG"


def client_properties(env: Mapping[str, str]) -> dict[str, str]:
    """The librdkafka properties of the file ``FENCE_KAFKA_CONFIG`` names ({} when unset):
    one ``key=value`` per line, blank lines and ``#`` comments ignored. Raises
    ``ConfigError`` naming the file (and the line) when it cannot be read or a line is not
    ``key=value``; a value never appears in a message."""
    path = env.get(KAFKA_CONFIG_ENV, "").strip()
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"{KAFKA_CONFIG_ENV} {path}: cannot read it ({exc.strerror})") \
            from None
    out: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{KAFKA_CONFIG_ENV} {path}: line {number} is not key=value")
        out[key.strip()] = value.strip()
    return out


def parse_x_options(items: Sequence[str], *, flag: str = "-X",
                    strip_values: bool = True) -> dict[str, str]:
    """``["k=v", ...]`` of a repeatable ``flag`` (``-X``, ``--handler-setting``) -> dict;
    raises ``ConfigError`` naming the malformed one."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r}: expected key=value")
        out[key] = value.strip() if strip_values else value
    return out


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("true", "1", "yes", "on")


def kafka_settings(cfg: WorkerConfig) -> dict[str, str]:
    """The librdkafka consumer configuration; raises ``ConfigError`` on a conflicting ``-X``."""
    x = dict(cfg.x_options)
    for key in _OWNED_FALSE:
        if key in x and _truthy(x[key]):
            raise ConfigError(
                f"-X {key}={x[key]} conflicts with the worker: it commits offsets itself after "
                "each PostgreSQL commit; remove the option")
    if "group.instance.id" in x and cfg.instance_id is None:
        raise ConfigError("-X group.instance.id: use --instance-id (or FENCE_INSTANCE_ID)")
    for key, mine, where in (
            ("group.id", cfg.group_id, "--group"),
            ("bootstrap.servers", cfg.bootstrap_servers,
             "--bootstrap-servers or KAFKA_BOOTSTRAP_SERVERS"),
            ("group.instance.id", cfg.instance_id or "", "--instance-id")):
        if key in x and x[key] != mine:
            raise ConfigError(f"-X {key}={x[key]} conflicts with the worker's {key} {mine!r}; "
                              f"set it once, with {where}, and drop the -X")
    if "auto.offset.reset" in x:
        raise ConfigError("-X auto.offset.reset: use --auto-offset-reset (the worker positions "
                          "the consumer from PostgreSQL and keeps librdkafka's reset at 'error')")
    proto = x.pop("group.protocol", cfg.group_protocol.value)
    if proto != cfg.group_protocol.value:
        raise ConfigError(f"-X group.protocol={proto} conflicts with "
                          f"--group-protocol {cfg.group_protocol.value}")
    settings: dict[str, str] = {
        "bootstrap.servers": cfg.bootstrap_servers,
        "group.id": cfg.group_id,
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",
        "auto.offset.reset": "error",
        "enable.partition.eof": "false",
        **PREFETCH,
        "group.protocol": cfg.group_protocol.value,
    }
    if cfg.instance_id is not None:
        settings["group.instance.id"] = cfg.instance_id
    if cfg.group_protocol is GroupProtocol.CONSUMER:
        for key in _KIP848_FORBIDDEN:
            if key in x:
                raise ConfigError(f"-X {key} cannot be set with --group-protocol consumer "
                                  "(KIP-848 keeps it on the broker)")
    else:
        strategy = x.pop("partition.assignment.strategy", cfg.strategy)
        if strategy != cfg.strategy:
            raise ConfigError(f"-X partition.assignment.strategy={strategy} conflicts with "
                              f"--assignment-strategy {cfg.strategy}")
        names = {s.strip() for s in strategy.split(",") if s.strip()}
        if not names or not names <= (_EAGER | _COOPERATIVE) or (names & _EAGER and
                                                                  names & _COOPERATIVE):
            raise ConfigError(f"--assignment-strategy {strategy!r}: expected range, roundrobin "
                              "(eager) or cooperative-sticky, not a mix of eager and cooperative")
        settings["partition.assignment.strategy"] = strategy
    settings.update(x)
    return settings


_DSN_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]*)(?P<at>@)",
                               re.IGNORECASE)
_DSN_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|\S+)",
                              re.IGNORECASE)
_DSN_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<pw>[^&\s]*)", re.IGNORECASE)


def redact_dsn(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***`` (URL, query or key=value form)."""
    out = _DSN_URL_PASSWORD.sub(lambda m: f"{m['head']}***{m['at']}", dsn)
    out = _DSN_QUERY_PASSWORD.sub(lambda m: f"{m['head']}***", out)
    return _DSN_KV_PASSWORD.sub(lambda m: f"{m['head']}***", out)


def redact(text: str, *, dsn: str) -> str:
    """``text`` with the DSN and its password removed wherever they appear."""
    if not dsn:
        return text
    text = text.replace(dsn, redact_dsn(dsn))
    for pattern in (_DSN_URL_PASSWORD, _DSN_QUERY_PASSWORD, _DSN_KV_PASSWORD):
        for m in pattern.finditer(dsn):
            pw = m["pw"].strip("'")
            if len(pw) >= 3:
                text = text.replace(pw, "***")
    return text
