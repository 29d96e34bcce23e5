"""PNG figures of a results document (matplotlib, from the ``bench`` extra), for docs/benchmarks/."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .model import LATENCY_UNIT, OPS_UNIT, THROUGHPUT_UNIT

COLOURS = {
    "groupcluster": "#1f77b4",
    "groupcluster-pure": "#aec7e8",  # a lighter blue: the same stack, interpreted
    "jgroups-5": "#d62728",
    "jgroups-2.12": "#ff7f0e",
    "raw-asyncio": "#7f7f7f",
    "raw-asyncio-relay": "#bcbcbc",
    "pysyncobj": "#2ca02c",
    "jgroups-5-tcp": "#ff9896",
    "jgroups-5-tcp-capacity": "#e377c2",
    "jgroups-5-mperf": "#8c564b",
    # The grid peers: a colour of their own each (the default cycle would start at groupcluster's blue).
    "infinispan": "#9467bd",
    "infinispan-tuned": "#c5b0d5",
    "hazelcast": "#17becf",
    "hazelcast-tuned": "#9edae5",
}
YLABELS = {
    THROUGHPUT_UNIT: "delivered msgs/s per member",
    OPS_UNIT: "applied updates/s per node",
    LATENCY_UNIT: "ms",
    "MB/s": "MB/s (10^6 bytes)",
    "entries/s": "entries/s",
    "ops/s": "ops/s, all clients",
}


@dataclass(frozen=True)
class Figure:
    """One PNG: the results it shows (one panel per unit among them) and its title."""

    filename: str
    title: str
    chosen: Callable[[Mapping[str, Any]], bool]


def _prefix(*prefixes: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda r: str(r["workload"]).startswith(prefixes)


FIGURES = (
    Figure("throughput.png", "Multicast throughput (4 members, TCP)", lambda r: r["unit"] == THROUGHPUT_UNIT),
    Figure(
        "latency.png",
        "Latency at half of each system's peak (4x100B)",
        lambda r: r["unit"] == LATENCY_UNIT and "-latency-" in r["workload"],
    ),
    Figure("replicated-counter.png", "Replicated counter, 3 nodes", lambda r: r["unit"] == OPS_UNIT),
    Figure(
        "join.png",
        "A 4th member joins 3: ms from its stack's start to the view of 4 (lower is better)",
        _prefix("join-"),
    ),
    Figure("state-transfer.png", "State transfer to a joiner (TCP)", _prefix("state-transfer-")),
    Figure(
        "grid-rebalance.png",
        "Grid rebalance: a 4th member joins 3 (write p99 idle vs during; CPU per MB moved)",
        _prefix("grid-rebalance-"),
    ),
    Figure(
        "grid-ops.png",
        "Grid operations, 4 client processes, 3 members (ops/s, request p50/p99, CPU per op)",
        _prefix("grid-ops-"),
    ),
)


def _label(y: float) -> str:
    if y >= 10_000:
        return f"{y / 1000:.0f}k"
    if y >= 1000:
        return f"{y / 1000:.1f}k"
    return f"{y:.3g}"


def _grouped_bars(ax: Any, results: Sequence[Mapping[str, Any]], ylabel: str) -> None:
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    systems = list(dict.fromkeys(r["system"] for r in results))
    width = min(0.8 / max(len(systems), 1), 0.5)  # a lone system's bars stay bars, not slabs
    by_key = {(r["workload"], r["system"]): r for r in results}
    for i, system in enumerate(systems):
        xs, ys, lo, hi = [], [], [], []
        for j, w in enumerate(workloads):
            if (w, system) in by_key:
                r = by_key[(w, system)]
                samples = r.get("samples") or [r["value"]]
                xs.append(j + (i - (len(systems) - 1) / 2) * width)
                ys.append(r["value"])
                lo.append(r["value"] - min(samples))
                hi.append(max(samples) - r["value"])
        # The bar is the median; the whisker spans the min-max of the measured rounds (the spread, not a point).
        bars = ax.bar(xs, ys, width, label=system, color=COLOURS.get(system), yerr=[lo, hi], capsize=2)
        ax.bar_label(bars, labels=[_label(y) for y in ys], fontsize=6)
    ax.set_xticks(range(len(workloads)), workloads, rotation=20, ha="right", fontsize=8)
    ax.set_xlim(-0.7, len(workloads) - 0.3)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def panels(results: Sequence[Mapping[str, Any]], figure: Figure) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """(unit, results) per panel of ``figure``, in the order the units first appear."""
    chosen = [r for r in results if figure.chosen(r)]
    units = list(dict.fromkeys(r["unit"] for r in chosen))
    return [(u, [r for r in chosen if r["unit"] == u]) for u in units]


def write_plots(doc: Mapping[str, Any], out: Path) -> list[Path]:
    """The PNGs of :data:`FIGURES` that have results; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env = doc.get("environment", {})
    repeat = doc.get("settings", {}).get("repeat")
    runs = "one run each" if repeat == 1 else f"medians of {repeat or 'repeated'} rounds, whiskers min-max"
    subtitle = f"{env.get('date', '')}, {env.get('cores', '?')} cores, loopback; {runs}"
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for figure in FIGURES:
        groups = panels(doc["results"], figure)
        if not groups:
            continue
        widths = [max(3.5, 1.3 * len({r["workload"] for r in rs}) + 2) for _, rs in groups]
        fig, axes = plt.subplots(
            1, len(groups), figsize=(max(6.0, sum(widths)), 4.4), squeeze=False, width_ratios=widths
        )
        for ax, (unit, rs) in zip(axes[0], groups, strict=True):
            _grouped_bars(ax, rs, YLABELS.get(unit, unit))
        fig.suptitle(f"{figure.title}\n{subtitle}", fontsize=9)
        fig.tight_layout()
        path = out / figure.filename
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
