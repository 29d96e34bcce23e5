"""The pure part of the benchmark suite: workloads, result entries, aggregation, JSON and the table.

Nothing here starts a process or reads a clock, so it is unit-tested (tests/unit/test_bench_cli.py). A run of
one system on a multicast workload yields one :class:`RunReport` per member (the ``RESULT`` line of a worker,
see :mod:`groupcluster.bench.workers`); :func:`throughput` and :func:`latency` turn a run into one figure, and
:func:`aggregate` turns the repeats into the median that the table, the JSON and the plots show. The join and
state-transfer workloads (:data:`LIFECYCLE_KINDS`) run the standalone scripts under ``bench/`` and the JGroups
``Lifecycle`` harness instead (:mod:`groupcluster.bench.figures` reads their output); the grid workloads run
our grid, Infinispan and Hazelcast through :mod:`groupcluster.bench.gridpeers_run`.
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
# Our stack with GROUPCLUSTER_PURE=1: the interpreted modules even where scripts/build-compiled built compiled
# ones, interleaved with the "groupcluster" rows so that what the compiled modules buy is measured in one run.
GROUPCLUSTER_PURE = "groupcluster-pure"
JGROUPS5 = "jgroups-5"
JGROUPS212 = "jgroups-2.12"
PYSYNCOBJ = "pysyncobj"
RAW = "raw-asyncio"
RAW_RELAY = "raw-asyncio-relay"
# JGroups 5 on the XML files shipped in its jar: "jgroups-5" runs tcp-new.xml (NAKACK4/UNICAST4, no flow
# control), "jgroups-5-tcp" the stock tcp.xml, "-tcp-capacity" tcp.xml with its bundler's capacity raised (the
# one stated tuning), and "jgroups-5-mperf" is JGroups' own MPerf tool on tcp-new.xml, the reference a harness
# far below would be caught by.
JGROUPS5_STOCK = "jgroups-5-tcp"
JGROUPS5_TUNED = "jgroups-5-tcp-capacity"
JGROUPS5_MPERF = "jgroups-5-mperf"
# The grid workloads (groupcluster.bench.gridpeers): our members, and Infinispan and Hazelcast embedded in member
# JVMs, each also with its documented bulk-transfer tuning (the "-tuned" rows of the rebalance workloads).
INFINISPAN = "infinispan"
HAZELCAST = "hazelcast"
INFINISPAN_TUNED = "infinispan-tuned"
HAZELCAST_TUNED = "hazelcast-tuned"
GRID_PEERS = (INFINISPAN, HAZELCAST, INFINISPAN_TUNED, HAZELCAST_TUNED)
SYSTEMS = (
    GROUPCLUSTER,
    JGROUPS5,
    JGROUPS212,
    PYSYNCOBJ,
    RAW,
    RAW_RELAY,
    JGROUPS5_STOCK,
    JGROUPS5_TUNED,
    JGROUPS5_MPERF,
    *GRID_PEERS,
    GROUPCLUSTER_PURE,
)
# system -> (the jar's XML file, bundler capacity raised?)
JGROUPS5_VARIANTS = {
    JGROUPS5: ("tcp-new.xml", False),
    JGROUPS5_STOCK: ("tcp.xml", False),
    JGROUPS5_TUNED: ("tcp.xml", True),
    JGROUPS5_MPERF: ("tcp-new.xml", False),
}

THROUGHPUT_UNIT = "msgs/s per member"
OPS_UNIT = "ops/s per node"
LATENCY_UNIT = "ms"
MB_UNIT = "MB/s"  # 10^6 bytes per second
ENTRIES_UNIT = "entries/s"
GRID_OPS_UNIT = "ops/s"  # all clients of a grid together

GRID_PEER_KIND = "grid-peers"  # the workload kind of groupcluster.bench.gridpeers_run
CPU_PER_MB_UNIT = "ms CPU/MB"
CPU_PER_OP_UNIT = "us CPU/op"

# Workload kinds that are not multicast runs of the workers: each runs a script or a JVM harness.
LIFECYCLE_KINDS = ("join", "state", GRID_PEER_KIND)


@dataclass(frozen=True)
class Workload:
    """One measured situation: who sends what through which kind of ordering."""

    name: str
    order: str  # "fifo", "total-order" or "counter" (replicated counter updates, totally ordered); "" otherwise
    members: int
    senders: int
    size: int  # bytes per message; the state's bytes (state); entries loaded (grid rebalance)
    kind: str = "throughput"  # "latency": paced at half the system's own peak of ``peak_of``; or LIFECYCLE_KINDS
    peak_of: str | None = None
    systems: tuple[str, ...] = ()
    description: str = ""
    stack: str = ""  # join: our stack preset ("fifo": a GMS join, "vsync": a flushed join)
    figure: str = ""  # grid: which figure of the shared run (see groupcluster.bench.gridpeers_run)
    fixed_unit: str = ""

    @property
    def unit(self) -> str:
        if self.fixed_unit:
            return self.fixed_unit
        if self.kind == "latency":
            return LATENCY_UNIT
        return OPS_UNIT if self.order == "counter" else THROUGHPUT_UNIT

    @property
    def run_group(self) -> str:
        """Workloads of one group read their figures from the same runs (one rebalance gives MB/s and more)."""
        if self.kind == GRID_PEER_KIND:
            return "grid-ops" if self.name.startswith("grid-ops-") else "grid-rebalance"
        if self.kind in ("join", "state") and self.figure:
            return self.name.removesuffix(f"-{self.figure}")  # one join-4 run gives its launch and warm figures
        return self.name


def _size_label(size: int) -> str:
    return f"{size // 1000}KB" if size >= 1000 and size % 1000 == 0 else f"{size}B"


def _workloads() -> list[Workload]:
    out: list[Workload] = []
    jg5 = (JGROUPS5, JGROUPS5_STOCK, JGROUPS5_TUNED)
    peers = {
        "fifo": (GROUPCLUSTER, *jg5, JGROUPS212, RAW),
        "total-order": (GROUPCLUSTER, *jg5, JGROUPS212, RAW_RELAY),
    }
    for order, systems in peers.items():
        for size in (100, 1000):
            label = _size_label(size)
            out.append(
                Workload(
                    f"{order}-4x{label}",
                    order,
                    4,
                    4,
                    size,
                    systems=(*systems, JGROUPS5_MPERF, GROUPCLUSTER_PURE),  # MPerf's own workload: all send
                    description=f"4 members, all send {label}",
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
                systems=tuple(x for x in systems if x not in (JGROUPS5_STOCK, JGROUPS5_TUNED)),
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
            description="3 nodes, every node increments a replicated counter, 1000 increments in flight per node; "
            "ops applied per node per second, the final value checked on every node",
        )
    )
    out.extend(_lifecycle_workloads())
    return out


# Sizes of the lifecycle workloads (the names carry them; the runner passes them to the scripts).
STATE_BYTES = 10_000_000
# Larger states, run only when named (--workloads 'state-transfer-100MB*'): minutes each on 2 cores.
OPTIONAL_STATE_BYTES = (100_000_000, 1_000_000_000)
OPTIONAL_WORKLOADS = ("state-transfer-100MB*", "state-transfer-1GB*")
REBALANCE_ENTRIES = 1_000_000
GRID_OPS_CLIENTS = 4


def _lifecycle_workloads() -> list[Workload]:
    """Joins, state transfer, rebalance and grid operations."""
    out = [
        Workload(
            "join-4",
            "",
            4,
            0,
            0,
            kind="join",
            stack="fifo",
            systems=(GROUPCLUSTER, JGROUPS5),
            fixed_unit=LATENCY_UNIT,
            description="a 4th member joins 3 that multicast 200 msgs/s each (GMS join, no flush); "
            "ms from its stack's start to the view of 4",
        ),
        Workload(
            "join-4-launch",
            "",
            4,
            0,
            0,
            kind="join",
            stack="fifo",
            figure="launch",
            systems=(GROUPCLUSTER, JGROUPS5),
            fixed_unit=LATENCY_UNIT,
            description="the join-4 joins timed from the joiner process's launch (Python / JVM start-up included)",
        ),
        Workload(
            "join-4-warm",
            "",
            4,
            0,
            0,
            kind="join",
            stack="fifo",
            figure="warm",
            systems=(GROUPCLUSTER, JGROUPS5),
            fixed_unit=LATENCY_UNIT,
            description="repeated joins from one process (connect .. leave, the first left out): ms from connect "
            "to the view of 4",
        ),
        Workload(
            "join-flush-4",
            "",
            4,
            0,
            0,
            kind="join",
            stack="vsync",
            systems=(GROUPCLUSTER, JGROUPS212),
            fixed_unit=LATENCY_UNIT,
            description="the same join with a flush before the view (our vsync stack, JGroups 2.12 pbcast.FLUSH)",
        ),
    ]
    for size in (STATE_BYTES, *OPTIONAL_STATE_BYTES):
        label = f"{size // 1_000_000_000}GB" if size >= 1_000_000_000 else f"{size // 1_000_000}MB"
        for suffix, figure, what in (
            ("", "", "the first fetch of a joiner process; MB/s from its first view to the last byte"),
            ("-launch", "launch", "the same first fetch, ms from the joiner process's launch (start-up included)"),
            ("-warm", "warm", "one process joins, fetches and leaves repeatedly; the median of fetches 2..N"),
        ):
            out.append(
                Workload(
                    f"state-transfer-{label}{suffix}",
                    "",
                    2,
                    0,
                    size,
                    kind="state",
                    figure=figure,
                    systems=(GROUPCLUSTER, JGROUPS5),
                    fixed_unit=LATENCY_UNIT if figure == "launch" else MB_UNIT,
                    description=f"a {label} state on one member: {what}",
                )
            )
    # One shared run per group and system gives all its figures (groupcluster.bench.gridpeers_run).
    reb = "grid-rebalance-3to4"
    loaded = (
        f"a 4th member joins 3 holding {REBALANCE_ENTRIES:,} entries of 100 B (50,000 with --quick), "
        "single PUTs at 200/s through a remote client; warm: a discarded join and leave first"
    )
    for suffix, figure, unit, what in (
        ("", "mb_per_s", MB_UNIT, "MB/s moved (keys and values) from its join to a balanced topology"),
        ("-entries", "entries_per_s", ENTRIES_UNIT, "entries/s moved"),
        ("-write-p99-idle", "idle_p99_ms", LATENCY_UNIT, "single-PUT p99 before the join (the idle figure)"),
        ("-write-p99-during", "during_p99_ms", LATENCY_UNIT, "single-PUT p99 during the rebalance"),
    ):
        out.append(
            Workload(
                reb + suffix,
                "",
                4,
                0,
                REBALANCE_ENTRIES,
                kind=GRID_PEER_KIND,
                figure=figure,
                systems=(GROUPCLUSTER, *GRID_PEERS),
                fixed_unit=unit,
                description=f"{loaded}: {what}",
            )
        )
    # In the order the clients run the steps (puts first: the gets read what they wrote).
    for mode, what in (
        ("single", "one key per request, 16 in flight per client"),
        ("batch", "1000 keys per request, 8 in flight per client"),
    ):
        for op in ("put", "get"):
            out.append(
                Workload(
                    f"grid-ops-{mode}-{op}",
                    "",
                    3,
                    GRID_OPS_CLIENTS,
                    100,
                    kind=GRID_PEER_KIND,
                    figure=f"{mode}-{op}",
                    systems=(GROUPCLUSTER, INFINISPAN, HAZELCAST),
                    fixed_unit=GRID_OPS_UNIT,
                    description=f"{GRID_OPS_CLIENTS} client processes (each system's remote client), 3 members, "
                    f"100 B values, {what}; ops/s of all clients, warm (a discarded pass first)",
                )
            )
    return out


WORKLOADS: dict[str, Workload] = {w.name: w for w in _workloads()}

# The quick selection: the headline workloads, a smoke run of every system.
QUICK_WORKLOADS = (
    "fifo-4x100B",
    "total-order-4x100B",
    "replicated-counter-3",
    "join-4*",  # join-4's runs give its -launch and -warm figures too
    "state-transfer-10MB*",
    "grid-ops-batch-*",
)
# Higher is better for these units (the table's ratio column); lower is better for ms.
HIGHER_IS_BETTER = (THROUGHPUT_UNIT, OPS_UNIT, MB_UNIT, ENTRIES_UNIT, GRID_OPS_UNIT)


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
    # The fair suite's round statistics (multicast workloads): median/min/max/q1/q3 of the measured rounds, CPU
    # (user+sys of all member processes) per delivered message, and the 1-minute load before each round.
    spread: dict[str, Any] | None = None
    cpu_us_per_message: float | None = None
    cpu_samples: list[float] = field(default_factory=list)
    load_before: list[float] = field(default_factory=list)
    # The grid workloads' CPU (all member processes), median over the runs, per MB moved or per operation:
    # ``cpu_unit`` says which (CPU_PER_MB_UNIT, CPU_PER_OP_UNIT); their cpu_samples are the runs' values.
    cpu: float | None = None
    cpu_unit: str = ""


def cpu_cell(r: Result) -> str:
    """The table's CPU figure of a result: per delivered message (multicast) or per MB / operation (grid)."""
    if r.cpu_us_per_message is not None:
        return f"{r.cpu_us_per_message:.2f} us/msg"
    if r.cpu is not None:
        return f"{r.cpu:,.1f} {r.cpu_unit.replace(' CPU', '')}"
    return ""


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
        if r.system == base or r.unit not in HIGHER_IS_BETTER or r.value <= 0:
            continue
        ours = by_key.get((r.workload, base))
        if ours is not None:
            out[(r.workload, r.system)] = ours.value / r.value
    return out


def fmt_value(value: float, unit: str) -> str:
    if unit in (LATENCY_UNIT, MB_UNIT):
        return f"{value:,.2f}"
    return f"{value:,.0f}"


def format_table(results: Sequence[Result], base: str = GROUPCLUSTER) -> str:
    """A plain-text table: one row per result, with our figure relative to each peer (``ours / peer``)."""
    rel = ratios(results, base)
    rows = [("workload", "system", "median", "unit", "rounds (min - max)", "CPU", f"{base} / this")]
    for r in results:
        spread = f"{len(r.samples)}"
        if len(r.samples) >= 2:
            spread += f" ({fmt_value(min(r.samples), r.unit)} - {fmt_value(max(r.samples), r.unit)})"
        ratio = rel.get((r.workload, r.system))
        rows.append(
            (
                r.workload,
                r.system,
                fmt_value(r.value, r.unit),
                r.unit,
                spread,
                cpu_cell(r),
                "" if ratio is None else f"{ratio:.2f}x",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {2, 5, 6}
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
        if isinstance(system, str) and not system.startswith((*SYSTEMS[:5], *GRID_PEERS)):
            problems.append(f"results[{i}].system {system!r} does not name a known system")
    return problems
