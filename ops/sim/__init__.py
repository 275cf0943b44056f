"""The deterministic worker simulator (``fencectl sim-worker``): trace format, schedule
generator, runner, oracle checks, report, reducer, corpus and sweep."""

from ops.sim.report import LABEL, Status, dumps_report
from ops.sim.runner import run_trace
from ops.sim.schedule import make_trace
from ops.sim.trace import Trace, TraceError, dumps, parse

__all__ = ["LABEL", "Status", "Trace", "TraceError", "dumps", "dumps_report", "make_trace",
           "parse", "run_trace"]
