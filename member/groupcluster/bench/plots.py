"""PNG figures of a results document (matplotlib, from the ``bench`` extra), for docs/benchmarks/."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .model import LATENCY_UNIT, OPS_UNIT, THROUGHPUT_UNIT

COLOURS = {
    "groupcluster": "#1f77b4",
    "jgroups-5": "#d62728",
    "jgroups-2.12": "#ff7f0e",
    "raw-asyncio": "#7f7f7f",
    "raw-asyncio-relay": "#bcbcbc",
    "pysyncobj": "#2ca02c",
}


def _grouped_bars(ax: Any, results: Sequence[Mapping[str, Any]], ylabel: str) -> None:
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    systems = list(dict.fromkeys(r["system"] for r in results))
    width = 0.8 / max(len(systems), 1)
    by_key = {(r["workload"], r["system"]): r["value"] for r in results}
    for i, system in enumerate(systems):
        xs, ys = [], []
        for j, w in enumerate(workloads):
            if (w, system) in by_key:
                xs.append(j + (i - (len(systems) - 1) / 2) * width)
                ys.append(by_key[(w, system)])
        bars = ax.bar(xs, ys, width, label=system, color=COLOURS.get(system))
        ax.bar_label(bars, labels=[f"{y / 1000:.0f}k" if y >= 1000 else f"{y:.2g}" for y in ys], fontsize=6)
    ax.set_xticks(range(len(workloads)), workloads, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def write_plots(doc: Mapping[str, Any], out: Path) -> list[Path]:
    """throughput.png, latency.png and replicated-counter.png for the results present; returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env = doc.get("environment", {})
    subtitle = f"{env.get('date', '')}, {env.get('cores', '?')} cores, loopback; medians of repeated runs"
    groups = [
        ("throughput.png", THROUGHPUT_UNIT, "Multicast throughput (4 members, TCP)", "delivered msgs/s per member"),
        ("latency.png", LATENCY_UNIT, "Latency at half of each system's peak (4x100B)", "ms (p50, p99)"),
        ("replicated-counter.png", OPS_UNIT, "Replicated counter, 3 nodes", "applied updates/s per node"),
    ]
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for filename, unit, title, ylabel in groups:
        chosen = [r for r in doc["results"] if r["unit"] == unit]
        if not chosen:
            continue
        fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len({r["workload"] for r in chosen}) + 3), 4.2))
        _grouped_bars(ax, chosen, ylabel)
        ax.set_title(f"{title}\n{subtitle}", fontsize=9)
        fig.tight_layout()
        path = out / filename
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
