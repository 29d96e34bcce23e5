"""The pure rules that make the peers suite fair: round order, statistics, CPU accounting, JGroups configs.

Nothing here starts a process; :mod:`groupcluster.bench.rounds` does, with these rules:

- :func:`interleave`: every system's member processes stay up for the whole workload and run W warm-up rounds
  and then R measured rounds, the systems taking turns round by round (A, B, C, A, B, C, ...), so a slow
  minute of the shared machine lands on all of them rather than on one.
- :func:`summarize`: the median of the measured rounds and their spread (min, max and quartiles).
- :func:`parse_proc_stat`, :func:`cpu_per_message_us`: user+system CPU of every member process (ours and the
  JVMs alike, from ``/proc/PID/stat``) over one measured round, per delivered message.
- :func:`jgroups_config`, :func:`config_diff`: JGroups' own shipped XML (``tcp.xml``, ``tcp-new.xml``) with
  SEQUENCER inserted where the jar's ``sequencer.xml`` puts it (just below FRAG2) for total order, and the
  transfer-queue bundler's capacity raised only where a row says so; addresses and ports come as the system
  properties the files already read (:func:`address_properties`).
- :func:`parse_mperf`: the summary of JGroups' own ``MPerf`` tool.
"""

from __future__ import annotations

import difflib
import re
import statistics
from collections.abc import Sequence
from typing import Any


def interleave(systems: Sequence[str], warmup: int, rounds: int) -> list[tuple[int, str, bool]]:
    """(round number from 1, system, measured?) in the order the rounds run: systems interleaved per round."""
    if warmup < 0 or rounds < 1:
        raise ValueError("need warmup >= 0 and rounds >= 1")
    return [(k, system, k > warmup) for k in range(1, warmup + rounds + 1) for system in systems]


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and the quartiles (inclusive method; equal to min/max for one or two samples)."""
    if not samples:
        raise ValueError("no samples")
    xs = sorted(float(x) for x in samples)
    if len(xs) >= 2:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1 = q3 = xs[0]
    return {"n": len(xs), "median": statistics.median(xs), "min": xs[0], "max": xs[-1], "q1": q1, "q3": q3}


def parse_proc_stat(text: str) -> tuple[int, int]:
    """(utime, stime) in clock ticks from the text of ``/proc/PID/stat``.

    The command name (field 2) is in parentheses and may itself hold spaces and parentheses, so the fields are
    counted from the last ``)``: utime and stime are fields 14 and 15 of the line.
    """
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return int(rest[11]), int(rest[12])


def cpu_seconds(stats: Sequence[str], ticks_per_second: float) -> float:
    """User+system seconds of the processes whose ``/proc/PID/stat`` texts are ``stats``."""
    return sum(sum(parse_proc_stat(t)) for t in stats) / ticks_per_second


def cpu_per_message_us(cpu_before: float, cpu_after: float, delivered: int) -> float | None:
    """Microseconds of CPU per delivered message (each member's delivery of a message counts once)."""
    if delivered <= 0:
        return None
    return (cpu_after - cpu_before) / delivered * 1e6


# -- JGroups configurations ----------------------------------------------------------------------------------
_FRAG2 = re.compile(r"^([ \t]*)<FRAG2\b", re.MULTILINE)
_TCP = re.compile(r"<TCP\b")


def jgroups_config(stock: str, *, sequencer: bool = False, bundler_capacity: int | None = None) -> str:
    """The shipped XML ``stock`` with only the stated changes: SEQUENCER for total order, a bundler capacity."""
    out = stock
    if sequencer:
        m = _FRAG2.search(out)
        if m is None:
            raise ValueError("no FRAG2 line to insert SEQUENCER below")
        out = out[: m.start()] + f"{m.group(1)}<SEQUENCER/>\n" + out[m.start() :]
    if bundler_capacity is not None:
        m = _TCP.search(out)
        if m is None:
            raise ValueError("no TCP element to set bundler.capacity on")
        out = out[: m.end()] + f' bundler.capacity="{bundler_capacity}"' + out[m.end() :]
    return out


def address_properties(ports: Sequence[int], rank: int) -> dict[str, str]:
    """The system properties the shipped files read for addresses and ports: loopback, one port per member."""
    return {
        "jgroups.bind_addr": "127.0.0.1",
        "jgroups.bind_port": str(ports[rank]),
        "jgroups.tcpping.initial_hosts": ",".join(f"127.0.0.1[{p}]" for p in ports),
        "jgroups.tcp.port_range": "0",
    }


def config_diff(stock: str, used: str, name: str) -> str:
    """A unified diff of the shipped file and the one used (empty when they are the same)."""
    lines = difflib.unified_diff(
        stock.splitlines(keepends=True), used.splitlines(keepends=True), f"jar:{name}", f"used:{name}"
    )
    return "".join(lines)


# -- JGroups' MPerf ------------------------------------------------------------------------------------------
_MPERF_NODE = re.compile(r"Average/node:\s+([\d,]+) msgs.*?msgs/sec=([\d,.]+)")
_MPERF_CLUSTER = re.compile(r"Average/cluster:\s+([\d,]+) msgs")


def parse_mperf(text: str) -> tuple[float, int] | None:
    """(msgs/s per member, messages received by all members) from MPerf's results, or None if absent."""
    node = _MPERF_NODE.search(text)
    cluster = _MPERF_CLUSTER.search(text)
    if node is None or cluster is None:
        return None
    return float(node.group(2).replace(",", "")), int(cluster.group(1).replace(",", ""))


def by_workload(results: Sequence[Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """workload -> system -> median, unit, spread and CPU (the ``--json`` summary).

    CPU is per delivered message for the multicast workloads (``cpu_us_per_message``) and per MB moved or per
    operation for the grid workloads (``cpu`` in ``cpu_unit``); the other stays empty.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in results:
        spread = r.spread if r.spread is not None else (summarize(r.samples) if r.samples else None)
        out.setdefault(r.workload, {})[r.system] = {
            "median": r.value,
            "unit": r.unit,
            "spread": spread,
            "cpu_us_per_message": r.cpu_us_per_message,
            "cpu": r.cpu,
            "cpu_unit": r.cpu_unit,
            "load_before": list(r.load_before),
            "note": r.note,
        }
    return out
