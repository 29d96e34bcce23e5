"""Long-lived member process sets that run rounds on command: warm-up and measured rounds in the same processes.

A :class:`MemberSet` starts one system's members (Python workers, JGroups harness JVMs or PySyncObj nodes),
waits for each to print ``READY``, and then runs round ``K`` by writing ``round K`` to every member's standard
input and collecting one ``RESULT {json}`` (or ``FAILED K ...``) line per member. :class:`MPerfSet` drives
JGroups' own ``MPerf`` the same way: its first member reads MPerf's menu keys from standard input (``1``
starts a test on every member), the others run with ``-nohup``. Both give the user+system CPU of their
processes from ``/proc`` (see :mod:`groupcluster.bench.fair`), so the runner reads it before and after a round.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fair import cpu_seconds, parse_mperf
from .model import RunReport

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class RoundFailed(Exception):
    """A round (or the start) did not complete; the message says why, with the members' last words."""


@dataclass
class RoundOutcome:
    """What one round gave: each member's report and JSON, or MPerf's own figure."""

    reports: list[RunReport] = field(default_factory=list)
    data: list[dict[str, Any]] = field(default_factory=list)
    value: float | None = None  # set when the tool computes its own figure (MPerf)
    delivered: int = 0  # messages delivered by all members in the round


class MemberSet:
    """One system's member processes, kept up across rounds."""

    def __init__(self, name: str, cmds: Sequence[Sequence[str]], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.cmds = [list(c) for c in cmds]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.logdir = Path(tempfile.mkdtemp(prefix=f"gc-bench-{name}-"))
        self.procs: list[subprocess.Popen[str]] = []
        self.lines: queue.Queue[tuple[int, str]] = queue.Queue()
        self.out: list[list[str]] = [[] for _ in self.cmds]  # recent stdout lines per member

    # -- processes ---------------------------------------------------------------------------------------
    def start(self, timeout: float) -> None:
        for rank, cmd in enumerate(self.cmds):
            err = open(self.logdir / f"member{rank}.err", "w")  # noqa: SIM115  # closed with the process
            p = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=self.env
            )
            self.procs.append(p)
            threading.Thread(target=self._pump, args=(rank, p), daemon=True).start()
        self._wait_ready(timeout)

    def _pump(self, rank: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.put((rank, line.rstrip("\n")))

    def _wait_ready(self, timeout: float) -> None:
        ready: set[int] = set()
        self._collect(lambda rank, line: ready.add(rank) if line == "READY" else None, lambda: len(ready), timeout)

    def _collect(self, on_line: Any, count: Any, timeout: float) -> None:
        """Feed stdout lines to ``on_line`` until ``count()`` reaches the number of members, or fail."""
        deadline = time.monotonic() + timeout
        while count() < len(self.procs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RoundFailed(f"timed out after {timeout:.0f} s with {count()} of {len(self.procs)}" + self.tails())
            try:
                rank, line = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
                if dead:
                    code = self.procs[dead[0]].returncode
                    raise RoundFailed(f"member {dead[0]} exited with {code}" + self.tails()) from None
                continue
            self.out[rank] = [*self.out[rank][-20:], line]
            if line.startswith("FAILED "):
                raise RoundFailed(f"member {rank}: {line}" + self.tails())
            on_line(rank, line)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def cpu(self) -> float:
        """User+system seconds of all members so far (threads included: /proc/PID/stat sums them)."""
        stats = []
        for pid in self.pids():
            try:
                stats.append(Path(f"/proc/{pid}/stat").read_text())
            except OSError:
                continue
        return cpu_seconds(stats, TICKS)

    def send(self, rank: int, text: str) -> None:
        p = self.procs[rank]
        assert p.stdin is not None
        p.stdin.write(text)
        p.stdin.flush()

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()
            if p.stdin is not None:
                with contextlib.suppress(OSError):
                    p.stdin.close()

    def tails(self, lines: int = 6) -> str:
        parts = []
        for f in sorted(self.logdir.glob("member*.err")):
            text = f.read_text(errors="replace").strip().splitlines()[-lines:]
            if text:
                parts.append(f"\n  {f.name}:\n    " + "\n    ".join(text))
        return "".join(parts) + f"\n  (logs in {self.logdir})"

    # -- rounds ------------------------------------------------------------------------------------------
    def run_round(self, round_no: int, timeout: float) -> RoundOutcome:
        for rank in range(len(self.procs)):
            self.send(rank, f"round {round_no}\n")
        got: dict[int, dict[str, Any]] = {}

        def on_line(rank: int, line: str) -> None:
            if line.startswith("RESULT "):
                data = json.loads(line[len("RESULT ") :])
                if data.get("round") == round_no:
                    got[rank] = data

        self._collect(on_line, lambda: len(got), timeout)
        data = [got[i] for i in range(len(self.procs))]
        reports = [RunReport.from_json(d) for d in data]
        return RoundOutcome(reports, data, None, sum(r.delivered for r in reports))


class MPerfSet(MemberSet):
    """JGroups' MPerf: member 0 is driven through its menu on standard input, the others run ``-nohup``."""

    def _wait_ready(self, timeout: float) -> None:
        members = len(self.procs)
        seen = [0]

        def on_line(rank: int, line: str) -> None:
            # MPerf prints "** [coord|id] (n) [...]" on each view.
            if rank == 0 and line.startswith("** ") and f"({members})" in line:
                seen[0] = members

        self._collect(on_line, lambda: seen[0], timeout)

    def run_round(self, round_no: int, timeout: float) -> RoundOutcome:
        self.send(0, "1\n")
        buf: list[str] = []
        done = [0]
        members = len(self.procs)

        def on_line(rank: int, line: str) -> None:
            if rank != 0:
                return
            buf.append(line)
            if "Average/cluster:" in line or "Received no results" in line:
                done[0] = members

        self._collect(on_line, lambda: done[0], timeout)
        parsed = parse_mperf("\n".join(buf))
        if parsed is None:
            raise RoundFailed("MPerf printed no results:\n  " + "\n  ".join(buf[-10:]))
        rate, delivered = parsed
        return RoundOutcome([], [], rate, delivered)
