"""The test suite's own cost: ``make test``'s wall time and its slowest tests, from the JUnit
XML pytest wrote, into ``docs/bench/suite.json``; ``docs/testing.md`` shows the table
(``ops.bench.tables``, region ``suite-slowest``).

Long because ``WHY`` holds one line per test that has been among the slowest: the data the
page shows beside each figure, not logic.

Rules
- ``python -m ops.bench.suite JUNIT --wall-s S --command CMD`` keeps the run's counts
  (passed, failed, skipped), its wall time as measured by the caller (``time``: the
  install and the services included) and the ``SLOWEST`` slowest tests with their seconds
  (setup, call and teardown: what the test costs the suite, less the waits it recorded
  that are not its own: ``WAITS``).
- Each of those tests is shown with what it proves — its docstring's first sentence, else
  its module's — and why it takes its time: ``WHY`` holds one line per test function, and
  ``why_missing`` names a slowest test that has none, so the page never shows a figure
  without its reason (tests/bench/test_suite.py).
- Pure past reading the XML and the test files: the same XML gives the same JSON.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ops.bench.provenance import provenance

__all__ = ["SLOWEST", "WHY", "render", "report", "why_missing"]

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "bench" / "suite.json"
SLOWEST = 30

#: waits a test records that are not its own (tests/conftest.py): the suite lock of the
#: xdist workers, the session's wait for its services and for Jaeger's and Prometheus's
#: builds
WAITS = ("suite_lock_wait_s", "go_build_wait_s", "services_start_wait_s")
#: test function -> why it takes its time (what it waits for, how long and why it must)
WHY: dict[str, str] = {
    "test_a_table_replicated_through_debezium_equals_its_source":
        "runs alone (exclusive): Debezium's snapshot and change events through a real Kafka "
        "Connect, which is SIGKILLed and restarted (its JVM and connector start again), a "
        "member frozen 8 s, the Kafka broker SIGKILLed and started again (log recovery), "
        "then PostgreSQL crashed (immediate shutdown, recovery) and the members that exit 5 "
        "(and the zombie, once fenced) restarted; the replica converges twice (before and "
        "after a truncate)",
    "test_a_frozen_registry_holds_only_the_partitions_that_need_it":
        "runs alone (exclusive): the registry SIGSTOPped for a fixed 20 s (FROZEN_S) under two "
        "Avro sink members, each registry call timing out at 3 s; then the drain",
    "test_a_handler_slower_than_the_idle_timeout_per_batch_drains_without_ending_a_lifetime":
        "the first 500-record batch (12 s) is cut at the 7.2 s call limit (90 % of the 8 s idle "
        "timeout) and split; then 598 records at 24 ms each: 14 s of handler time",
    "test_a_killed_member_restarted_at_once":
        "drains 8,000 records (0.1 s per 20-record batch) across a SIGKILL and an immediate "
        "restart under the same --instance-id, whose partitions must return in < 15 s",
    "test_a_killed_members_partitions_go_unowned_until_the_survivor_claims_them":
        "two KIP-848 members scraped every 2 s; after the SIGKILL the victim's partitions stay "
        "unowned until the broker's 6 s session ends and the survivor claims them",
    "test_a_pattern_routed_into_three_tables_under_a_kill_and_lost_commits":
        "3 topics x 2,400 records fed 200 every 0.5 s, one created mid-run (1 s metadata "
        "refresh), 2 lost COMMITs, a SIGKILL that moves after the 6 s KIP-848 session",
    "test_a_record_slower_than_the_budget_alone_is_reported_once_and_handled_per_declaration":
        "the 25 s record's call is cut at the 7.2 s call limit (90 % of the 8 s "
        "idle-in-transaction timeout) before it is quarantined or the worker fail-stops",
    "test_a_record_that_kills_its_process_is_quarantined_after_max_attempts_deaths":
        "3 self-SIGKILLs at offset 0:5 (1 in a batch, 2 alone); each moves the partition only "
        "after the dead member's 2 s session; both restart once both are dead",
    "test_a_reset_over_a_replayed_record_applies_it_again":
        "one sink worker, then `fencectl quarantine replay` and `fencectl reset frontier` "
        "subprocesses; the running worker picks the reset up (1 s heartbeat)",
    "test_a_running_owner_picks_up_resets_of_an_idle_and_a_busy_partition":
        "two `fencectl reset` runs (each reads Kafka's watermarks), 300 records produced 20 ms "
        "apart over the busy reset, `fencectl status` polled until Kafka mirrors",
    "test_a_sigkilled_member_is_restarted_and_the_set_drains_exactly_once":
        "a --processes 2 set drains 4,000 records at 0.2 s per 20-record batch (<= ~800/s); the "
        "SIGKILLed member is restarted, its partitions move after its session",
    "test_a_spare_kip848_member_waits_and_the_not_ready_alert_leaves_it_out":
        "waits for 10 Prometheus scrapes of the waiting spare (2 s interval: >= 18 s), then, "
        "after the owner's SIGKILL, the broker's 6 s KIP-848 session",
    "test_a_stall_is_visible_in_readyz_metrics_status_and_the_log":
        "batches held in their transactions past --stall-timeout-s 2 (lag sampled every 0.67 s), "
        "`fencectl status` subprocesses, then 400 records drained once released",
    "test_a_stalled_partition_fires_the_alert_and_it_resolves":
        "the rule's `for: 1m` in a real Prometheus, after a 2 s stall timeout, <= 5 s target "
        "discovery, 2 s scrapes and 1 s evaluations; then the resolve",
    "test_a_stream_of_one_record_batches_keeps_the_member_and_kafka_in_step":
        "30,000 records paced at 1,000/s (30 s) make batches of one or two; the session loss it "
        "pins showed ~14 s in; then kafka-consumer-groups (a JVM) reads lag 0",
    "test_a_wire_fault_at_every_statement":
        "held replies wait out the 2 s budget (BUDGET_S; a heartbeat's 2 s command timeout) "
        "before the cancel; cuts take < 1 s; a worker's first case pays stack start",
    "test_avro_v1_to_v2_mid_stream_under_a_kill_after_the_alter_and_a_lost_commit":
        "460 Avro records in four schema versions, produced in steps; w1 SIGKILLed right after "
        "its ALTER, w2 claiming after w1's session; one lost COMMIT reply resolved",
    "test_bad_fence_http_port_is_refused_by_run_only":
        "three cold `fencectl` subprocesses (run, status, stack env), each importing the CLI; "
        "nothing is waited for",
    "test_best_effort_never_claims_completeness_in_status_or_metrics":
        "a worker drains 50 records and is scraped until a lag sample shows; then two `fencectl "
        "status` subprocesses (JSON and text)",
    "test_broken_successor_fails_the_cells_it_must":
        "four crash-matrix cells in a row (1,200 records, 3 partitions each): A crashes at its "
        "point, B takes over after A's 2 s classic session and drains",
    "test_claim_ends_an_older_owners_session_that_blocks_it":
        "the `waits` control holds the claim for its whole 6 s wait_for to show it is held "
        "hostage; `unblocks` ends the blocking session after 1 s",
    "test_crash_and_restart_exactly_once":
        "20,000 records, 4 partitions; three members SIGKILLed soon after assignment, each "
        "successor waiting out the dead one's session (2 s classic, 6 s KIP-848)",
    "test_crash_point_cell":
        "A is brought to its crash point and killed or frozen; B claims after A's session (2 s "
        "classic, 6 s KIP-848), drains 1,200 records; tool cells run the tool 3x",
    "test_derived_reconcilable_converges_under_kills_and_again_from_a_fresh_process":
        "900 records at 0.05 s per 20-record batch, drained twice: under two SIGKILLs (each "
        "successor after the 2 s session), then after three `fencectl reset` runs",
    "test_durable_critical_applies_every_effect_exactly_once_and_claims_completeness":
        "600 records at 0.1 s per 20-record batch, a SIGKILL at 200 and a restart that claims "
        "after the dead member's 2 s session, then a `fencectl status` subprocess",
    "test_each_mutant_is_first_killed_by_its_pinned_run":
        "CPU only: replays the simulation sweep's runs in order up to the mutant's pinned first "
        "kill (82 runs for adopt-observed-epoch, seed 41)",
    "test_help_of_every_command_shown_runs_as_typed":
        "one cold shell per fencectl command path the pages show, running its `--help` (each "
        "stack and reset subcommand its own), one after another",
    "test_idle_members_killed_repeatedly_never_quarantine":
        "four members in turn: each of the first three claims only after the SIGKILLed one's 2 s "
        "session expires, then is killed; the fourth applies 10 new records",
    "test_idle_worker_issues_only_heartbeats_and_uses_no_cpu":
        "the 60 s idle window the issue sets (30 heartbeats at 2 s, CPU < 1 %), after a "
        "300-record backlog and a 3 s settle",
    "test_kafka_fault_under_load":
        "three-node cluster: the coordinator SIGKILLed under 15,000 records, or each node "
        "restarted in turn under a 150/s feed, back healthy and in sync; then lag 0",
    "test_kafka_offsets_equal_frontiers_after_churn":
        "12,000 records fed in 12 chunks 0.8 s apart, 4 lost COMMITs, a SIGKILL (moved after its "
        "session), a SIGTERM, 5 members; kafka-consumer-groups (a JVM) twice",
    "test_killers_poison_and_flaky_records_blame_only_the_guilty":
        "5,000 records, two supervised members; the 2 killer records cost up to 8 SIGKILL deaths, "
        "each a 1 s restart and a 2 s classic session timeout until the partition moves",
    "test_list_show_replay_fail_again_and_purge":
        "ten `fencectl` subprocesses in sequence (list, show x2, replay x4, status, purge x2), "
        "each a cold start of the CLI",
    "test_live_and_killed_members":
        "member b's 25 s Kafka session: after its SIGKILL the stale view (heartbeat stale at 3 s) "
        "is read, then a's claim waits for that session to expire",
    "test_quick_lanes_bench_drains_every_run_and_writes_its_table":
        "four runs of a member whose handler waits 20 ms per 10-record call (1 and 6 partitions "
        "x lanes 1 and 4), each a fresh topic, schema and process, about a second of records "
        "each after its claim",
    "test_lanes_survive_kills_and_a_zombie_exactly_once":
        "6,000 records at 20 ms per 20-record lane batch: three members SIGKILLed in turn, each "
        "after its assignment (the next claims after the session), a zombie frozen until the "
        "last member is assigned, then continued 3 s and stopped; the drain to the fold",
    "test_lanes_survive_lost_commit_replies_a_broker_loss_and_a_postgres_crash":
        "runs alone (exclusive): 6,000 records in six chunks, four of them each waiting for a lost "
        "lane COMMIT reply; then the Kafka broker SIGKILLed (2 s down, log recovery) and "
        "PostgreSQL crashed (recovery), members that exit 5 started again; the drain",
    "test_lost_commit_replies_resolve_without_duplicates":
        "10,000 records in 1,000 sequential 10-record transactions (--db-concurrency 1) through "
        "the wire proxy, six COMMIT replies lost one at a time",
    "test_make_demo":
        "`make demo` as typed: 60,000 records produced, two workers (--batch-max-records 20), one "
        "stopped with SIGTERM, the other processing every record",
    "test_member_started_while_postgres_is_down_comes_up_when_it_returns":
        "PostgreSQL kept down 10 s (DOWN_S) after the member's first retry; its retries back off "
        "0.5, 2, then 5 s, so it comes up at most 5 s after PostgreSQL",
    "test_members_drain_a_backlog_exactly_once_and_stop_on_sigterm":
        "a --processes 2 set: `fencectl status` polled until both members run, /readyz of each, "
        "then 6,000 records drained and the set stopped with SIGTERM",
    "test_missed_poll_interval_calls_on_lost_then_rejoins":
        "a 5 s stall in delivery against max.poll.interval.ms 2500: waits for on_lost from the "
        "next consume(), then the rejoin and a new assignment",
    "test_no_librdkafka_lines_on_stderr_unless_debug":
        "four `produce` runs with nine dead brokers listed before the live one, two `status` runs "
        "against a dead broker, each waiting --kafka-timeout-s 2 per request",
    "test_outcome_uncertain_effects_are_never_made_twice":
        "1,500 records, two KIP-848 members: three SIGKILLs by the test plus the two killer "
        "records' deaths, each moving partitions after the broker's 6 s session",
    "test_pattern_picks_up_a_topic_created_while_running":
        "four topics created (each until its leaders answer); the one created mid-run is found by "
        "a 1 s metadata refresh and a rebalance; then `fencectl status`",
    "test_paused_partition_lost_and_reassigned_is_fetched_again":
        "10,000 records at ~400/s (0.1 s per 10-record batch, 4 partitions: >= 25 s), the member "
        "SIGSTOPped until the broker expires it (2 s classic, 6 s KIP-848)",
    "test_paused_partition_moved_away_and_back_is_fetched_again":
        "10,000 records at ~400/s (0.1 s per 10-record batch, 4 partitions: >= 25 s) while a "
        "second member joins, commits 400 more, and leaves",
    "test_process_applies_quarantines_and_advances_past_gaps":
        "a few statements; its time is the session's `services` fixture (the stack started or "
        "leased) when it is its xdist worker's first PostgreSQL test",
    "test_produce_refuses_bad_usage":
        "five `fencectl produce` runs; the one against 127.0.0.1:1 waits out produce's fixed 10 s "
        "list_topics timeout before `cannot reach Kafka`",
    "test_quick_bench_produces_every_run_ratio_and_scale_point":
        "the quick bench: 21 runs on 6,000 records, each its own processes, schema and "
        "CHECKPOINT; then scale (1-3 members, a 20,000 backlog, 12 x 1 MiB records)",
    "test_rebalance_under_load":
        "50,000 records fed in 10 chunks 0.6 s apart as six members churn: a SIGTERM leave, three "
        "joins, two SIGKILLs moved after the session (2 s classic, 6 s KIP-848)",
    "test_relay_killed_between_ack_and_mark_loses_nothing_and_dedupes":
        "a sink worker quarantines 30 of 300 records, then five CLI runs (relay killed at its "
        "crash point, relay, replay, purge, relay) and the DLQ read back",
    "test_run_retries_an_unreachable_kafka_within_its_bound_then_exits_5":
        "`run` against 127.0.0.1:1 with --outage-bound-s 6: two 5 s metadata probes, 0.5 s apart, "
        "before the bound ends it with exit 5",
    "test_shutdown_bound_is_final_even_for_work_ignoring_cancellation":
        "SIGTERM with a batch that ignores cancellation: the 2 s --shutdown-timeout-s, then the "
        "store's 5 s close bound for the abandoned connection, then exit 6",
    "test_sigterm_mid_backlog_drains_every_member_and_exits_0":
        "a --processes 2 set of slow members (0.2 s per 20-record batch) started until both run, "
        "SIGTERM after 400 of 4,000 records, a second set drains the rest",
    "test_table_sink_under_rebalance_churn_applies_every_record_once":
        "12,000 JSON records fed 1,500 every 0.4 s while five members churn: a SIGTERM leave, two "
        "joins, two SIGKILLs that move after the 2 s classic session",
    "test_the_page_runs_as_written":
        "plays the page's blocks as typed: each `fencectl run` started in the background, then "
        "Ctrl-C; each `wait` block re-run every 2 s (<= 180 s) until it matches",
    "test_the_readme_quick_start_handler_is_exactly_once":
        "a pytest subprocess runs check_handler over 120 records in 3 partitions: a clean run, "
        "then a faulty one in small batches through the wire proxy",
    "test_transient_twice_applies_once_after_backoff_while_the_sibling_flows":
        "partition 0 fails twice with Transient and backs off 2-4 s, then 4-8 s "
        "(--retry-initial-ms 4000, jittered), so a cold `fencectl status` sees it retrying",
    "test_trees_runs_a_commit_and_this_tree_alternately":
        "checks HEAD out into a git worktree and runs c_fenceworker on 2,000 records from each "
        "tree (a fresh schema and CHECKPOINT each), then removes the worktree",
    "test_unreachable_kafka_is_one_line_naming_where_the_address_came_from":
        "four CLI runs side by side against 127.0.0.1:1: `run` waits its 5 s metadata probe, "
        "`produce` its fixed 10 s list_topics timeout",
    "test_up_refuses_a_taken_port_and_names_the_override":
        "`stack up` waits PORT_RELEASE_S (10 s) for a taken port to free (room for a SIGKILLed "
        "JVM's sockets) before refusing; the test holds the port throughout",
    "test_upsert_sink_with_a_bigint_key_under_kills_and_lost_commits_equals_the_fold":
        "6,000 records fed 500 every 0.5 s under six members: two SIGKILLs, a SIGTERM, four lost "
        "COMMITs; every partition changes hands (after a killed owner's session)",
    "test_zombie_is_fenced_and_applies_nothing":
        "B claims after SIGSTOPped A's session (2 s classic, 6 s KIP-848) and lock (2 s idle "
        "timeout, 5 s unblock), drains 2,000; A staying a member runs out a.wait(30)",
}


def _function(test_id: str) -> str:
    """``test_name`` of ``tests/x.py::test_name[param]``."""
    return test_id.split("::")[-1].split("[")[0]


def _first_sentence(text: str | None) -> str:
    if not text:
        return ""
    flat = " ".join(text.strip().split())
    end = flat.find(". ")
    return flat if end < 0 else flat[:end + 1]


def proves(test_id: str, root: Path = ROOT) -> str:
    """The first sentence of the test function's docstring, else of its module's."""
    path = root / test_id.split("::")[0]
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return ""
    name = _function(test_id)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            own = _first_sentence(ast.get_docstring(node))
            if own:
                return own
    return _first_sentence(ast.get_docstring(tree))


def _test_id(case: ET.Element) -> str:
    """``tests/x/y.py::name`` of a JUnit testcase (classname ``tests.x.y``)."""
    module = (case.get("classname") or "").replace(".", "/")
    return f"{module}.py::{case.get('name')}"


def report(junit: Path, *, wall_s: float, command: str, root: Path = ROOT) -> dict[str, Any]:
    """What ``suite.json`` holds for the run that wrote ``junit``."""
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    timed = []
    for case in cases:
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        counts[outcome] += 1
        waits = sum(float(prop.get("value") or 0.0) for prop in case.iter("property")
                    if prop.get("name") in WAITS)
        timed.append((max(0.0, float(case.get("time") or 0.0) - waits), _test_id(case)))
    timed.sort(key=lambda t: (-t[0], t[1]))
    return {
        "provenance": provenance(command),
        "wall_s": round(wall_s, 1),
        "tests": counts,
        "slowest": [{"test": test_id, "seconds": round(seconds, 1),
                     "proves": proves(test_id, root)}
                    for seconds, test_id in timed[:SLOWEST]],
    }


def why_missing(data: dict[str, Any]) -> list[str]:
    """The slowest tests of ``data`` whose function has no line in ``WHY``."""
    return sorted({_function(row["test"]) for row in data["slowest"]} - set(WHY))


def render(data: dict[str, Any]) -> list[str]:
    """The table of the slowest tests (the region ``suite-slowest`` of docs/testing.md)."""
    lines = ["| # | test | s | what it proves | why it takes its time |", "|---:|---|---:|---|---|"]
    for i, row in enumerate(data["slowest"], 1):
        why = WHY.get(_function(row["test"]), "**no reason recorded**")
        lines.append(f"| {i} | `{row['test']}` | {row['seconds']:.1f} | {row['proves']} "
                     f"| {why} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.suite",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("junit", type=Path, help="the JUnit XML of the make test run")
    p.add_argument("--wall-s", type=float, required=True, help="the run's wall time")
    p.add_argument("--command", required=True, help="what was run, as typed")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    data = report(a.junit, wall_s=a.wall_s, command=a.command)
    a.out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    missing = why_missing(data)
    if missing:
        print(f"no reason in ops.bench.suite.WHY for: {', '.join(missing)}", file=sys.stderr)
        return 1
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
