"""PNG charts of ``make bench`` next to its JSON (matplotlib: the ``bench`` extra).

- ``throughput.png``: records/s per run (median), the ratios in the title (the reference
  handler's on one line, the table sink's on the next); ``throughput_sink.png`` for
  ``--sink-only`` (``make bench-sink``), so it never replaces ``make bench``'s chart.
- ``scale.png``: assignment cost (claim + seek) against partitions per member, and
  records/s against members on 12 partitions.
- ``latency.png``: produce-to-commit latency (p50, p95, p99, max) against the offered rate,
  one panel per handler, the rate also as a share of that handler's capacity.
Without matplotlib it writes nothing and says so (the JSON is the result; the charts show it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_all"]


def write_all(result: dict[str, Any], folder: Path, suffix: str = "") -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install -e '.[bench]'): no charts written")
        return []
    written = []
    runs = result["runs"]
    names = list(runs)
    fig, ax = plt.subplots(figsize=(9, 2 + 0.35 * len(names)))
    rates = [runs[n]["records_per_s"] for n in names]
    bars = ax.barh([runs[n].get("label", n) for n in names], rates, color="#4878a8")
    ax.bar_label(bars, labels=[f"{r:,}" for r in rates], padding=3, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("records/s (median of repeats)")
    shown = [[f"{k.replace('_over_', '/')} {v}" for k, v in result["ratios"].items()
              if v is not None and ("sink" in k) == sink] for sink in (False, True)]
    ratio_text = "\n".join("  ".join(group[i:i + 4]) for group in shown
                           for i in range(0, len(group), 4))
    target = result.get("targets", {}).get("c_sink_fenceworker_records_per_s")
    if target and any("sink" in n for n in names):  # the table sink's target
        ax.axvline(target, color="#b04040", linestyle="--", linewidth=1)
        ax.text(target, -0.6, f" sink target {target:,}", color="#b04040", fontsize=7)
    ax.set_title(f"{result['count']:,} records, {result['partitions']} partitions\n{ratio_text}",
                 fontsize=9)
    fig.tight_layout()
    written.append(folder / f"throughput{suffix}.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    scale = result.get("scale")
    if scale:
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
        pts = [a for a in scale["assignment"] if "claim_seek_s" in a]
        left.plot([a["partitions"] for a in pts], [a["claim_seek_s"] * 1000 for a in pts],
                  marker="o")
        left.set_xscale("log", base=2)
        left.set_xlabel("partitions assigned to one member")
        left.set_ylabel("claim + seek (ms)")
        left.set_ylim(bottom=0)
        joins = "\n".join(f"{j['setup']}: {j['join_to_all_committed_s']} s"
                           for j in scale.get("join_3x48", []) if "join_to_all_committed_s" in j)
        left.set_title("assignment cost (one member)", fontsize=9)
        left.text(0.02, 0.97, f"3 members x 48 partitions,\njoin -> all committed:\n{joins}",
                  transform=left.transAxes, fontsize=7, va="top")
        members = scale["members_12_partitions"]
        right.plot([m["members"] for m in members], [m["records_per_s"] for m in members],
                   marker="o")
        right.set_xticks([m["members"] for m in members])
        right.set_xlabel("members (12 partitions)")
        right.set_ylabel("records/s")
        right.set_ylim(bottom=0)
        backlog = scale.get("backlog", {})
        right.set_title(f"scale-out; backlog {backlog.get('records', 0):,} drained by 3 in "
                        f"{backlog.get('elapsed_s', 0)} s", fontsize=9)
        fig.tight_layout()
        written.append(folder / "scale.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    steady = (result.get("latency") or {}).get("steady")
    if steady:
        written.append(_latency_chart(plt, steady, folder / "latency.png"))
    return written


def _latency_chart(plt: Any, steady: list[dict[str, Any]], path: Path) -> Path:
    handlers = list(dict.fromkeys(r["handler"] for r in steady))
    fig, axes = plt.subplots(1, len(handlers), figsize=(5 * len(handlers), 4), squeeze=False)
    for ax, handler in zip(axes[0], handlers, strict=True):
        runs = [r for r in steady if r["handler"] == handler]
        rates = [r["rate"] for r in runs]
        for key, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^-"), ("max", "x:")):
            ax.plot(rates, [r["commit_ms"][key] for r in runs], style, label=key)
        if all(r.get("control_ms", {}).get("p99") is not None for r in runs):
            ax.plot(rates, [r["control_ms"]["p99"] for r in runs], "v:", color="grey",
                    label="plain consumer p99")
        ax.set_yscale("log")
        ax.set_xlabel("offered records/s")
        ax.set_ylabel("produce -> commit (ms)")
        ax.set_xticks(rates, [f"{r:,}\n({x['share']:.0%})" for r, x in zip(rates, runs,
                                                                         strict=True)])
        ax.set_title(f"{handler}: latency against the offered rate", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
