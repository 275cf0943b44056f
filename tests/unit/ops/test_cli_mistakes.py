"""Newcomer mistakes that need no service: each is a real ``fencectl`` subprocess that
exits 2 with exactly one line naming the setting to fix, and never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fencing.handler import load_handler
from tests.cli_output import one_line

ROOT = Path(__file__).resolve().parents[3]
# nothing listens on port 1 of loopback: connecting is refused at once
NOWHERE_KAFKA = "127.0.0.1:1"
NOWHERE_DSN = "postgresql://fenceworker:NotTheSecret1@127.0.0.1:1/fenceworker"
RUN = ["run", "--topic", "t", "--group", "g"]
NO_STACK_DIR = Path(tempfile.gettempdir()) / f"fence-unit-no-stack-{os.getuid()}"


def fencectl(*args: str, env: dict[str, str] | None = None,
             timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("FENCE_", "KAFKA_", "OTEL_"))}
    full.update({"PYTHONPATH": str(ROOT), "OTEL_TRACES_EXPORTER": "none",
                 "FENCE_STACK_DIR": str(NO_STACK_DIR),
                 "KAFKA_BOOTSTRAP_SERVERS": NOWHERE_KAFKA, "FENCE_DSN": NOWHERE_DSN})
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "ops.cli", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=timeout_s, check=False)


def test_bad_fence_http_port_is_refused_by_run_only() -> None:
    done = fencectl(*RUN, env={"FENCE_HTTP_PORT": "abc"})
    assert done.returncode == 2
    line = one_line(done)
    assert line.startswith("fencectl run: FENCE_HTTP_PORT='abc'") and "0..65535" in line
    status = fencectl("status", env={"FENCE_HTTP_PORT": "abc", "FENCE_DSN": ""})
    assert status.returncode == 2  # FENCE_DSN unset: status does not care about the port
    assert "FENCE_HTTP_PORT" not in one_line(status) and "FENCE_DSN" in status.stderr
    env_out = fencectl("stack", "env", env={"FENCE_HTTP_PORT": "abc"})
    assert env_out.returncode == 0 and "Traceback" not in env_out.stderr


def test_incoherent_handler_is_refused_at_load_naming_it_and_the_pair() -> None:
    done = fencectl(*RUN, "--handler", "tests.unit.ops.handlers_mixed:mailer")
    assert done.returncode == 2
    line = one_line(done)
    assert "--handler tests.unit.ops.handlers_mixed:mailer" in line
    assert "durability=durable-critical effects=loss-tolerant" in line
    # the module imports, and its coherent handler loads
    assert callable(load_handler("tests.unit.ops.handlers_mixed:ledger"))


@pytest.mark.parametrize("extra, env, needle", [
    (["--group-protocol", "consumer", "--assignment-strategy", "range"], {},
     "--assignment-strategy range cannot be used with --group-protocol consumer"),
    (["--log-level", "foo"], {}, "--log-level 'foo'"),
    ([], {"FENCE_LOG_LEVEL": "loud"}, "FENCE_LOG_LEVEL 'loud'"),
    (["--db-idle-in-transaction-timeout-s", "30"], {},
     "--db-idle-in-transaction-timeout-s 30: use more than 0 and less than the 20 s"),
    (["--call-budget-s", "5"], {},
     "--db-idle-in-transaction-timeout-s 8: use more than 0 and less than the 5 s lifetime "
     "budget (--call-budget-s"),
    (["-X", "bootstrap.servers=other:9092"], {}, "--bootstrap-servers"),
    (["-X", "group.id=other"], {}, "set it once, with --group"),
    ([], {"KAFKA_BOOTSTRAP_SERVERS": ""}, "no --bootstrap-servers given"),
    (["--topic-pattern", r"orders-\d+"], {},
     "--topic-pattern 'orders-\\d+': \\d is not POSIX extended regex syntax"),
    (["--topic-pattern", "t-(["], {}, "--topic-pattern 't-([': not a regular expression"),
    (["--topic", "^t.*"], {}, "--topic '^t.*': a topic name (for a regex use --topic-pattern)"),
    (["--retry-max-attempts", "0"], {}, "--retry-max-attempts must be >= 1 (got 0)"),
    (["--retry-initial-ms", "500", "--retry-max-ms", "100"], {},
     "--retry-max-ms must be >= --retry-initial-ms"),
    (["--max-attempts", "0"], {}, "--max-attempts must be >= 1 (got 0)"),
])
def test_run_refuses_configuration_mistakes(extra: list[str], env: dict[str, str],
                                            needle: str) -> None:
    done = fencectl(*RUN, *extra, env=env)
    assert done.returncode == 2
    assert needle in one_line(done)


def test_run_needs_a_topic_or_a_pattern() -> None:
    done = fencectl("run", "--group", "g")
    assert done.returncode == 2
    assert one_line(done) == "fencectl run: --topic or --topic-pattern is required"


def test_unreachable_kafka_is_one_line_naming_where_the_address_came_from() -> None:
    """Each waits out its Kafka timeout (5 s for run, 10 s for produce): run concurrently.
    For ``run`` a Kafka that does not answer is an outage, not a mistake: retried within
    ``--outage-bound-s`` (0 here: the first failure ends it), then exit 5 naming it."""
    produce = ["produce", "--topic", "t", "--count", "1", "--seed", "1", "--class", "valid"]
    no_retry = ("--outage-bound-s", "0")
    cases = {
        "run flag": ((*RUN, *no_retry, "--bootstrap-servers", NOWHERE_KAFKA),
                     {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:2"},
                     f"fencectl run: --bootstrap-servers {NOWHERE_KAFKA}: Kafka did not answer "
                     "for "),
        "run env": ((*RUN, *no_retry), {},
                    f"fencectl run: KAFKA_BOOTSTRAP_SERVERS {NOWHERE_KAFKA}: Kafka did not "
                    "answer for "),
        "produce flag": ((*produce, "--bootstrap-servers", NOWHERE_KAFKA), {},
                         f"fencectl produce: --bootstrap-servers {NOWHERE_KAFKA}: cannot reach"),
        # the old spelling is a hidden alias of the same flag
        "produce alias": ((*produce, "--bootstrap", NOWHERE_KAFKA), {},
                          f"fencectl produce: --bootstrap-servers {NOWHERE_KAFKA}: cannot reach"),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        done = {name: pool.submit(fencectl, *argv, env=env)
                for name, (argv, env, _) in cases.items()}
    for name, (_argv, _env, prefix) in cases.items():
        got = done[name].result()
        assert got.returncode == (5 if name.startswith("run") else 2), (name, got.stderr[-2000:])
        line = one_line(got)  # no librdkafka log lines
        assert line.startswith(prefix), (name, line)
        if name.startswith("run"):
            assert " s (--outage-bound-s 0): no answer to a metadata request" in line, line
        if "flag" in name or "alias" in name:
            assert "KAFKA_BOOTSTRAP_SERVERS" not in line, (name, line)


def test_help_texts_as_documented() -> None:
    produce = fencectl("produce", "--help")
    assert produce.returncode == 0
    assert "--bootstrap-servers" in produce.stdout
    assert "--bootstrap " not in produce.stdout  # the old spelling is a hidden alias
    frontier = fencectl("reset", "frontier", "--help")
    assert frontier.returncode == 0
    assert "default" not in frontier.stdout.split("--partition PARTITION", 2)[-1].split(
        "--to-offset")[0]
    run = fencectl("run", "--help")
    assert "refused with --group-protocol consumer" in " ".join(run.stdout.split())


def test_run_retries_an_unreachable_kafka_within_its_bound_then_exits_5() -> None:
    """Each retry is logged with its wait; past the bound the one error line names Kafka."""
    done = fencectl(*RUN, "--outage-bound-s", "6")
    assert done.returncode == 5, done.stderr[-3000:]
    retries = [ln for ln in done.stderr.splitlines() if "Kafka not answering at start" in ln]
    assert retries and "(--outage-bound-s 6)" in retries[0]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fencectl run: KAFKA_BOOTSTRAP_SERVERS {NOWHERE_KAFKA}: Kafka did "
                           "not answer for "), last
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("tool", [
    ("quarantine", "replay", "--group", "g"),
    ("quarantine", "relay", "--group", "g", "--topic", "dlq"),
    ("reset", "frontier", "--group", "g", "--topic", "t", "--partition", "0", "--to-offset",
     "1", "--yes-i-understand"),
])
def test_a_tool_with_crash_points_refuses_a_bad_fence_crash_at(tool: tuple[str, ...]) -> None:
    """Never silently disarmed: the crash matrix's tool cells rely on the point firing."""
    done = fencectl(*tool, env={"FENCE_CRASH_AT": "in-replays"})
    assert done.returncode == 2, done.stderr
    assert "FENCE_CRASH_AT 'in-replays'" in one_line(done)
