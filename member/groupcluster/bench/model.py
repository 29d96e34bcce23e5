"""The pure part of the benchmark suite: workloads, result entries, aggregation, JSON and the table.

Nothing here starts a process or reads a clock, so it is unit-tested (tests/unit/test_bench_cli.py). A run of
one system on one workload yields one :class:`RunReport` per member (the ``RESULT`` line of a worker, see
:mod:`groupcluster.bench.workers`); :func:`throughput` and :func:`latency` turn a run into one figure, and
:func:`aggregate` turns the repeats into the median that the table, the JSON and the plots show.
"""

from __future__ import annotations

import fnmatch
import json
import platform
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# Systems, by family; a workload lists which of them it runs. A system name is what the JSON and the table say.
GROUPCLUSTER = "groupcluster"
JGROUPS5 = "jgroups-5"
JGROUPS212 = "jgroups-2.12"
PYSYNCOBJ = "pysyncobj"
RAW = "raw-asyncio"
RAW_RELAY = "raw-asyncio-relay"
SYSTEMS = (GROUPCLUSTER, JGROUPS5, JGROUPS212, PYSYNCOBJ, RAW, RAW_RELAY)

THROUGHPUT_UNIT = "msgs/s per member"
OPS_UNIT = "ops/s per node"
LATENCY_UNIT = "ms"


@dataclass(frozen=True)
class Workload:
    """One measured situation: who sends what through which kind of ordering."""

    name: str
    order: str  # "fifo", "total-order" or "counter" (replicated counter updates, totally ordered)
    members: int
    senders: int
    size: int
    kind: str = "throughput"  # or "latency": paced at half the system's own peak of ``peak_of``
    peak_of: str | None = None
    systems: tuple[str, ...] = ()
    description: str = ""

    @property
    def unit(self) -> str:
        if self.kind == "latency":
            return LATENCY_UNIT
        return OPS_UNIT if self.order == "counter" else THROUGHPUT_UNIT


def _size_label(size: int) -> str:
    return f"{size // 1000}KB" if size >= 1000 and size % 1000 == 0 else f"{size}B"


def _workloads() -> list[Workload]:
    out: list[Workload] = []
    peers = {
        "fifo": (GROUPCLUSTER, JGROUPS5, JGROUPS212, RAW),
        "total-order": (GROUPCLUSTER, JGROUPS5, JGROUPS212, RAW_RELAY),
    }
    for order, systems in peers.items():
        for size in (100, 1000):
            label = _size_label(size)
            out.append(
                Workload(
                    f"{order}-4x{label}", order, 4, 4, size, systems=systems, description=f"4 members, all send {label}"
                )
            )
            out.append(
                Workload(
                    f"{order}-1of4x{label}",
                    order,
                    4,
                    1,
                    size,
                    systems=systems,
                    description=f"4 members, one sends {label}",
                )
            )
        out.append(
            Workload(
                f"{order}-4x100B-latency",
                order,
                4,
                4,
                100,
                kind="latency",
                peak_of=f"{order}-4x100B",
                systems=systems,
                description="4 members, all send 100B, paced at half the system's own peak",
            )
        )
    out.append(
        Workload(
            "replicated-counter-3",
            "counter",
            3,
            3,
            16,
            systems=(GROUPCLUSTER, PYSYNCOBJ),
            description="3 nodes, every node increments a replicated counter",
        )
    )
    return out


WORKLOADS: dict[str, Workload] = {w.name: w for w in _workloads()}

# The quick selection: the headline workloads, about two minutes for every system.
QUICK_WORKLOADS = ("fifo-4x100B", "total-order-4x100B", "replicated-counter-3")


def select(patterns: Iterable[str], names: Iterable[str]) -> list[str]:
    """The names matching any of the shell-style ``patterns`` (an exact name is a pattern), in ``names`` order."""
    pats = [p.strip() for p in patterns if p.strip()]
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in pats)]


def with_peaks(names: Sequence[str]) -> list[str]:
    """Add the throughput workloads that the chosen latency workloads pace against, before them."""
    out: list[str] = []
    for name in names:
        peak = WORKLOADS[name].peak_of
        if peak is not None and peak not in out:
            out.append(peak)
        if name not in out:
            out.append(name)
    return out


@dataclass(frozen=True)
class RunReport:
    """What one member printed after one run (times in seconds of CLOCK_MONOTONIC, shared by all processes)."""

    rank: int
    delivered: int
    first: float | None
    last: float | None
    send_start: float | None = None
    send_end: float | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    latency_samples: int = 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunReport:
        def num(key: str) -> float | None:
            value = data.get(key)
            return float(value) if isinstance(value, int | float) else None

        return cls(
            rank=int(data["rank"]),
            delivered=int(data["delivered"]),
            first=num("first"),
            last=num("last"),
            send_start=num("send_start"),
            send_end=num("send_end"),
            p50_us=num("p50_us"),
            p99_us=num("p99_us"),
            latency_samples=int(data.get("latency_samples") or 0),
        )


def parse_result_line(line: str) -> RunReport | None:
    """The report in a worker's ``RESULT {json}`` line, or None for any other line."""
    if not line.startswith("RESULT "):
        return None
    return RunReport.from_json(json.loads(line[len("RESULT ") :]))


def throughput(reports: Sequence[RunReport]) -> float:
    """Messages delivered per member per second, the median over members.

    Each member's rate is what it delivered divided by the time from the first send of any member to its own
    last delivery, so start-up skew and a slow tail count against the system (the same rule for every system).
    """
    starts = [r.send_start for r in reports if r.send_start is not None]
    if not starts:
        raise ValueError("no member reported a send start")
    t0 = min(starts)
    rates = []
    for r in reports:
        if r.last is None or r.last <= t0 or r.delivered <= 0:
            rates.append(0.0)
        else:
            rates.append(r.delivered / (r.last - t0))
    return statistics.median(rates)


def latency(reports: Sequence[RunReport]) -> tuple[float, float]:
    """(p50, p99) in milliseconds: the medians over members of each member's percentiles."""
    p50 = [r.p50_us for r in reports if r.p50_us is not None]
    p99 = [r.p99_us for r in reports if r.p99_us is not None]
    if not p50 or not p99:
        raise ValueError("no member reported latency samples")
    return statistics.median(p50) / 1000.0, statistics.median(p99) / 1000.0


@dataclass
class Result:
    """One line of the results: the median of ``samples`` (the repeats) of one system on one workload."""

    workload: str
    system: str
    value: float
    unit: str
    samples: list[float] = field(default_factory=list)
    note: str = ""


def aggregate(workload: str, system: str, unit: str, samples: Sequence[float], note: str = "") -> Result:
    """The median of the repeats (noisy shared machine: the median resists one disturbed run)."""
    if not samples:
        raise ValueError(f"{workload}/{system}: no samples")
    return Result(workload, system, float(statistics.median(samples)), unit, [float(s) for s in samples], note)


def ratios(results: Sequence[Result], base: str = GROUPCLUSTER) -> dict[tuple[str, str], float]:
    """(workload, peer) -> our value / the peer's value, for throughput workloads measured for both."""
    by_key = {(r.workload, r.system): r for r in results}
    out: dict[tuple[str, str], float] = {}
    for r in results:
        if r.system == base or r.unit == LATENCY_UNIT or r.value <= 0:
            continue
        ours = by_key.get((r.workload, base))
        if ours is not None:
            out[(r.workload, r.system)] = ours.value / r.value
    return out


def _fmt_value(value: float, unit: str) -> str:
    if unit == LATENCY_UNIT:
        return f"{value:.2f}"
    return f"{value:,.0f}"


def format_table(results: Sequence[Result], base: str = GROUPCLUSTER) -> str:
    """A plain-text table: one row per result, with our figure relative to each peer (``ours / peer``)."""
    rel = ratios(results, base)
    rows = [("workload", "system", "value", "unit", "runs (min - max)", f"{base} / this")]
    for r in results:
        spread = f"{len(r.samples)}"
        if len(r.samples) >= 2:
            spread += f" ({_fmt_value(min(r.samples), r.unit)} - {_fmt_value(max(r.samples), r.unit)})"
        ratio = rel.get((r.workload, r.system))
        rows.append(
            (
                r.workload,
                r.system,
                _fmt_value(r.value, r.unit),
                r.unit,
                spread,
                "" if ratio is None else f"{ratio:.2f}x",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {2, 5}
    lines = []
    for n, row in enumerate(rows):
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def environment(date: str, load: Sequence[float] | None, cores: int | None) -> dict[str, Any]:
    """What the JSON says about the machine: the figures are only comparable within one run."""
    return {
        "date": date,
        "cores": cores,
        "loadavg_at_start": list(load) if load is not None else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def to_json(results: Sequence[Result], env: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The one JSON object of ``--json``: ``results`` entries carry workload, system, value and unit."""
    return {
        "suite": "peers",
        "environment": dict(env),
        "settings": dict(settings),
        "results": [asdict(r) for r in results],
        "ratios": [
            {"workload": w, "system": s, "groupcluster_over_system": round(v, 4)}
            for (w, s), v in sorted(ratios(results).items())
        ],
    }


def validate_json(doc: Mapping[str, Any]) -> list[str]:
    """Problems with a results document (empty when it follows the schema the issue asks for)."""
    problems = []
    results = doc.get("results")
    if not isinstance(results, list):
        return ["'results' is not a list"]
    for i, entry in enumerate(results):
        if not isinstance(entry, dict):
            problems.append(f"results[{i}] is not an object")
            continue
        for key, kind in (("workload", str), ("system", str), ("value", (int, float)), ("unit", str)):
            if not isinstance(entry.get(key), kind):
                problems.append(f"results[{i}].{key} missing or not {kind}")
        system = entry.get("system")
        if isinstance(system, str) and not system.startswith(SYSTEMS[:5]):
            problems.append(f"results[{i}].system {system!r} does not name a known system")
    return problems
