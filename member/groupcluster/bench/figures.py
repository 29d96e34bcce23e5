"""Read the join and state-transfer figures out of what the scripts and the JGroups harness print.

Pure functions over text and parsed JSON, unit-tested in tests/unit/test_bench_workloads.py. The scripts
(``bench/join_latency.py``, ``bench/state_transfer.py``) print one JSON object with ``--json``; the JGroups
``Lifecycle`` harness prints ``RESULT {json}`` lines (``join_ms``, ``state_ms``, ``state_bytes``). A missing
or malformed figure is a :class:`FigureError` naming the key and what was there, so a changed script fails
loudly instead of feeding a wrong number into the table.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .model import Workload


class FigureError(ValueError):
    """A script's or harness's output lacks a figure the suite needs."""


def script_json(stdout: str, script: str) -> dict[str, Any]:
    """The JSON object a script printed with ``--json``: the whole output, or the object on its last lines.

    Scripts print their object last (compact on one line or indented over many); anything before it (a stray
    progress line) is skipped by trying each line that opens an object at its first column, last first.
    """
    text = stdout.strip()
    if not text:
        raise FigureError(f"{script}: printed nothing on stdout (expected one JSON object with --json)")
    try:
        doc = json.loads(text)
    except ValueError:
        lines = text.splitlines()
        doc = None
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].startswith("{"):
                try:
                    doc = json.loads("\n".join(lines[i:]))
                    break
                except ValueError:
                    continue
        if doc is None:
            raise FigureError(f"{script}: no JSON object in its output: {text[-300:]!r}") from None
    if not isinstance(doc, dict):
        raise FigureError(f"{script}: printed {type(doc).__name__}, expected a JSON object")
    return doc


def number(doc: Mapping[str, Any], *path: str, source: str) -> float:
    """``doc[path[0]][path[1]]...`` as a float; a FigureError names the missing key and the keys present."""
    node: Any = doc
    for depth, key in enumerate(path):
        if not isinstance(node, Mapping) or key not in node:
            where = ".".join(path[:depth]) or "the top level"
            present = sorted(node) if isinstance(node, Mapping) else type(node).__name__
            raise FigureError(f"{source}: no {key!r} in {where} (found: {present})")
        node = node[key]
    if isinstance(node, bool) or not isinstance(node, int | float):
        raise FigureError(f"{source}: {'.'.join(path)} is {node!r}, not a number")
    return float(node)


def numbers(doc: Mapping[str, Any], key: str, source: str) -> list[float]:
    """A non-empty list of numbers under ``key``."""
    value = doc.get(key)
    if not isinstance(value, list) or not value:
        raise FigureError(f"{source}: {key!r} is {value!r}, expected a non-empty list of numbers")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        raise FigureError(f"{source}: {key!r} holds a value that is not a number: {value!r}")
    return [float(v) for v in value]


def join_ms(doc: Mapping[str, Any]) -> float:
    """One join run of bench/join_latency.py: the median over its rounds of the stack-start-to-view ms."""
    return statistics.median(numbers(doc, "join_ms", "join_latency.py"))


def join_launch_ms(doc: Mapping[str, Any]) -> float:
    """One join run of bench/join_latency.py: the median over its rounds of process launch to view, in ms."""
    return statistics.median(numbers(doc, "launch_to_view_ms", "join_latency.py"))


def warm_median(values: Sequence[float], source: str) -> float:
    """The median of repeated joins from one process, the first (cold in that process) left out."""
    if len(values) < 2:
        raise FigureError(f"{source}: {len(values)} warm joins, need at least 2 (the first is left out)")
    return statistics.median(values[1:])


def join_warm_ms(doc: Mapping[str, Any]) -> float:
    """One join run of bench/join_latency.py: the median of its warm joins (``--warm-rounds``)."""
    return warm_median(numbers(doc, "warm_join_ms", "join_latency.py"), "join_latency.py")


def state_mb_per_s(doc: Mapping[str, Any], size: int) -> float:
    """One run of bench/state_transfer.py: the state's MB (10^6 bytes) over the transfer seconds."""
    got = number(doc, "size_bytes", source="state_transfer.py")
    if got != size:
        raise FigureError(f"state_transfer.py: moved a state of {got:.0f} bytes, expected {size}")
    seconds = number(doc, "transfer_s", source="state_transfer.py")
    if seconds <= 0:
        raise FigureError(f"state_transfer.py: transfer_s is {seconds}, not positive")
    return size / 1e6 / seconds


def lifecycle_result(line: str) -> dict[str, Any] | None:
    """The object of a JGroups Lifecycle harness's ``RESULT {json}`` line, or None for any other line."""
    if not line.startswith("RESULT "):
        return None
    try:
        doc = json.loads(line[len("RESULT ") :])
    except ValueError as exc:
        raise FigureError(f"Lifecycle harness: bad RESULT line {line!r}: {exc}") from None
    if not isinstance(doc, dict):
        raise FigureError(f"Lifecycle harness: RESULT is not an object: {line!r}")
    return doc


def view_line(line: str) -> int | None:
    """The view size in a Lifecycle member's ``VIEW n`` line, or None for any other line."""
    if not line.startswith("VIEW "):
        return None
    try:
        return int(line[len("VIEW ") :])
    except ValueError:
        raise FigureError(f"Lifecycle harness: bad VIEW line {line!r}") from None


def java_join_ms(results: Sequence[Mapping[str, Any]]) -> float:
    """The median ``join_ms`` of a run's joiner JVMs (one RESULT per round; the warm joins are not among them)."""
    launched = [r for r in results if not r.get("warm")]
    if not launched:
        raise FigureError("Lifecycle harness: no joiner reported a result")
    return statistics.median(number(r, "join_ms", source="Lifecycle harness") for r in launched)


def java_join_launch_ms(results: Sequence[Mapping[str, Any]]) -> float:
    """The median ``launch_to_view_ms`` of a run's joiner JVMs (JVM start-up included)."""
    values = [float(r["launch_to_view_ms"]) for r in results if not r.get("warm") and "launch_to_view_ms" in r]
    if not values:
        raise FigureError("Lifecycle harness: no joiner reported launch_to_view_ms")
    return statistics.median(values)


def java_join_warm_ms(results: Sequence[Mapping[str, Any]]) -> float:
    """The median ``join_ms`` of the repeated joins of one joiner JVM, its first left out."""
    values = [float(r["join_ms"]) for r in results if r.get("warm")]
    return warm_median(values, "Lifecycle harness")


def java_state_mb_per_s(result: Mapping[str, Any], size: int) -> float:
    """MB/s of a Lifecycle joiner's state: ``state_bytes`` over ``state_ms`` (first view to last byte)."""
    got = number(result, "state_bytes", source="Lifecycle harness")
    if got != size:
        raise FigureError(f"Lifecycle harness: got a state of {got:.0f} bytes, expected {size}")
    ms = number(result, "state_ms", source="Lifecycle harness")
    if ms <= 0:
        raise FigureError(f"Lifecycle harness: state_ms is {ms}, not positive")
    return size / 1e6 / (ms / 1000.0)


def state_warm_mb_per_s(doc: Mapping[str, Any], size: int) -> float:
    """bench/state_transfer.py ``--repeat``: the median MB/s of the fetches after the first of its process."""
    state_mb_per_s(doc, size)  # the same checks of the size
    seconds = numbers(doc, "transfer_s_all", "state_transfer.py")
    if len(seconds) < 2 or min(seconds) <= 0:
        raise FigureError(f"state_transfer.py: transfer_s_all is {seconds}, need 2 or more positive times")
    return statistics.median(size / 1e6 / t for t in seconds[1:])


def state_launch_ms(doc: Mapping[str, Any]) -> float:
    """bench/state_transfer.py ``--launch-wall-ms``: ms from the joiner process's launch to its state in place."""
    return number(doc, "launch_to_state_ms", source="state_transfer.py")


def java_state_launch_ms(doc: Mapping[str, Any]) -> float:
    """The joiner JVM's first fetch: ms from its launch to the last byte of the state (JVM start-up included)."""
    return number(doc, "launch_to_state_ms", source="Lifecycle harness")


def java_state_warm_mb_per_s(doc: Mapping[str, Any], size: int) -> float:
    """The median MB/s of the joiner JVM's fetches after its first (``warm``: their RESULT objects)."""
    warm = doc.get("warm")
    if not isinstance(warm, list) or not warm:
        raise FigureError("Lifecycle harness: no warm state fetches")
    return statistics.median(java_state_mb_per_s(r, size) for r in warm)


def _median_of(values: Sequence[Any]) -> float | None:
    nums = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return statistics.median(nums) if nums else None


def note(system: str, w: Workload, docs: Sequence[Any]) -> str:
    """What else the runs said, for the JSON's ``note`` (best effort: a missing detail is left out)."""
    parts: list[str] = []
    if w.kind == "join" and system == "groupcluster":
        rounds = [v for d in docs for v in d.get("join_ms", [])]
        launch = _median_of([v for d in docs for v in d.get("launch_to_view_ms", [])])
        parts.append("rounds " + ", ".join(f"{v:.0f}" for v in rounds) + " ms")
        if launch is not None:
            parts.append(f"from process launch (Python start-up included) {launch:.0f} ms")
    elif w.kind == "join":
        rounds = [r for d in docs for r in d]
        parts.append("rounds " + ", ".join(f"{r.get('join_ms', 0):.0f}" for r in rounds) + " ms")
        start = _median_of([r.get("stack_start_ms") for r in rounds])
        if start is not None:
            parts.append(f"of which connect to stack start {start:.0f} ms")
    elif w.kind == "state" and system == "groupcluster":
        both = _median_of([d.get("join_and_transfer_s") for d in docs])
        if both is not None:
            parts.append(f"join + transfer {both * 1000:.0f} ms")
    elif w.kind == "state":
        both = _median_of([d.get("join_and_state_ms") for d in docs])
        if both is not None:
            parts.append(f"join + transfer {both:.0f} ms")
    return "; ".join(parts)
