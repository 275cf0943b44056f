"""Text rendering of ``fencectl status`` (pure): the PARTITIONS, TOPICS, NOTES and MEMBERS
tables of ``ops.commands.status.build_status`` output, and the journal of ``--history``.

Rules
- A missing value prints as ``-``; the KAFKA column prints ``?`` when Kafka did not answer
  and marks a committed offset that differs from the frontier with ``!``; the LAG column
  marks a best-effort handler's lag ``(best-effort)`` (its frontier claims no completeness).
- A note shared by several partitions of one row set prints once.
- A member whose table sink ignored fields with no column (its row's
  ``sink_unknown_fields``) gets an UNKNOWN FIELDS line per table: never silent; one whose
  version guard left changes alone (``sink_stale_changes``) a STALE CHANGES line per table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["render_history", "render_text"]


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[("-" if c is None else str(c)) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in cells]


def render_text(status: Mapping[str, Any]) -> str:
    """Human-readable tables of ``build_status`` output."""
    out = [f"fence status at {status['at']}", "", "PARTITIONS"]
    prow = [(p["group"], p["topic"], p["partition"], p["epoch"], p["frontier"],
             _kafka_cell(p), p["high_watermark"], _lag_cell(p), p["owner"],
             p["owner_availability"] if p["owner_state"] is None
             else f"{p['owner_availability']}/{p['owner_state']}")
            for p in status["partitions"]]
    out += _table(("GROUP", "TOPIC", "PART", "EPOCH", "FRONTIER", "KAFKA", "HIGH", "LAG",
                   "OWNER", "OWNER-STATE"), prow) if prow else ["(no partition rows)"]
    trow = [(t["group"], t["topic"], t["partitions"], t["owned_live"], t["lag"],
             t["stalled"]) for t in status["topics"]]
    if trow:
        out += ["", "TOPICS", *_table(("GROUP", "TOPIC", "PARTITIONS", "OWNED", "LAG",
                                        "STALLED"), trow)]
    notes = [f"  {p['topic']}[{p['partition']}]: {n}" for p in status["partitions"]
             for n in p["notes"]]
    if notes:
        out += ["", "NOTES", *dict.fromkeys(notes)]
    out += ["", "MEMBERS"]
    mrow = []
    for m in status["members"]:
        last = m["last_observed"]
        mrow.append((m["group"], m["lifetime"], m["host"], m["pid"], m["availability"],
                     m["state"], f"{m['last_seen_age_s']:.1f}s ago",
                     None if last is None else f"{last['state']} at {last['at']}"))
    out += _table(("GROUP", "LIFETIME", "HOST", "PID", "AVAILABILITY", "STATE", "LAST-SEEN",
                   "LAST-OBSERVED"), mrow) if mrow else ["(no members seen recently)"]
    unknown = [f"  {m['group']} {m['lifetime']}: {table}: {got['records']} records held "
               f"fields with no column, ignored: {', '.join(got['fields'])}"
               for m in status["members"]
               for table, got in (m.get("sink_unknown_fields") or {}).items() if got["records"]]
    if unknown:
        out += ["", "UNKNOWN FIELDS (table sink; --sink-evolve add-columns adds them, "
                "fencectl sink plan prints the ALTERs)", *unknown]
    stale = [f"  {m['group']} {m['lifetime']}: {table}: {n} changes older than the stored "
             "row left alone"
             for m in status["members"]
             for table, n in (m.get("sink_stale_changes") or {}).items() if n]
    if stale:
        out += ["", "STALE CHANGES (table sink, --sink-version-column)", *stale]
    return "\n".join(out)


def _lag_cell(p: Mapping[str, Any]) -> str | None:
    """LAG column: the lag, marked ``(best-effort)`` where the frontier claims no
    completeness."""
    if p["lag"] is None or p["completeness"] != "not-claimed":
        return p["lag"]
    return f"{p['lag']} (best-effort)"


def _kafka_cell(p: Mapping[str, Any]) -> str:
    """KAFKA column: the committed offset (``none``, ``?`` unknown), ``!`` on a mismatch."""
    if p["kafka_mirror"] == "unknown":
        return "?"
    value = "none" if p["kafka_committed"] is None else str(p["kafka_committed"])
    return f"{value} !" if p["kafka_mirror"] == "mismatch" else value


def render_history(rows: Sequence[Mapping[str, Any]]) -> str:
    """The journal rows of ``fencectl status --history`` as a table."""
    if not rows:
        return "(no journal rows)"
    return "\n".join(_table(("ID", "AT", "GROUP", "EVENT", "EPOCH", "LIFETIME", "DETAIL"),
                            [(r["id"], r["at"], r["group"], r["event"], r["epoch"],
                              r["lifetime"], r["detail"]) for r in rows]))
