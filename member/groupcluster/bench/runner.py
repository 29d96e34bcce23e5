"""Run the peers suite: start every system's member processes on loopback, collect their result lines.

(The join, state-transfer and grid workloads go to :class:`groupcluster.bench.lifecycle.LifecycleRunner`.)

One run = one system on one workload: N member processes on 127.0.0.1 (Python workers, member JVMs or
PySyncObj nodes), each printing one ``RESULT`` line when it has delivered everything; then the runner kills
them all (SIGKILL: nobody leaves while another still needs it, and teardown is not measured). Runs are
sequential, so systems never compete with each other for the two cores; they do compete with whatever else
the machine is doing, which is why every figure is the median of ``--repeat`` runs.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import jgroups
from .lifecycle import LifecycleRunner
from .model import (
    GROUPCLUSTER,
    JGROUPS5,
    JGROUPS212,
    LATENCY_UNIT,
    LIFECYCLE_KINDS,
    PYSYNCOBJ,
    RAW,
    RAW_RELAY,
    Result,
    RunReport,
    Workload,
    aggregate,
    latency,
    parse_result_line,
    throughput,
)


class RunFailed(Exception):
    """A run did not produce a result from every member; the message carries the members' last words."""


@dataclass
class Settings:
    """How much each run sends (the same for every system of a workload) and how often runs repeat."""

    # Per sender when all send; a lone sender sends members * messages. 12000 keeps the default suite (3 runs of
    # everything, joins, state transfer and the grid included) near 25 minutes on the shared 2-core machine.
    messages: int = 12000
    counter_ops: int = 5000  # increments per node in replicated-counter-3
    raw_factor: int = 4  # the raw limit runs longer, or it ends before a measurement is meaningful
    repeat: int = 3
    latency_seconds: float = 4.0
    timeout: float = 180.0
    join_rounds: int = 3  # joins per run of join-4 / join-flush-4 (the run's figure is their median)
    rebalance_idle_seconds: float = 3.0  # writes on the idle grid before the 4th member starts
    grid_single_ops: int = 1000  # keys per client, one per request (grid-ops-*-single)
    grid_batch_ops: int = 20000  # keys per client in batches (grid-ops-*-batch)
    script_timeout: float = 600.0  # one run of a bench/ script or of a JGroups joiner
    cluster_prefix: str = field(default_factory=lambda: f"gcb{os.getpid()}")


def free_ports(n: int, spacing: int = 100) -> list[int]:
    """``n`` free TCP ports on 127.0.0.1 whose ``port + spacing`` is free too (JGroups' FD_SOCK2 uses it)."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + spacing > 65535 or port in ports or port + spacing in ports:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + spacing))
        except OSError:
            continue
        ports.append(port)
    return ports


class Runner:
    """Builds peers on demand, runs workloads, keeps the peaks that latency workloads pace against."""

    def __init__(self, settings: Settings, progress: Callable[[str], None]) -> None:
        self.settings = settings
        self.progress = progress
        self.peaks: dict[tuple[str, str], float] = {}
        self._java: dict[str, jgroups.JavaPeer] = {}
        self._runs = 0
        self.lifecycle = LifecycleRunner(settings, progress, self._java_peer, free_ports)

    # -- commands ----------------------------------------------------------------------------------------
    def _java_peer(self, system: str) -> jgroups.JavaPeer:
        if system not in self._java:
            build = jgroups.jgroups5 if system == JGROUPS5 else jgroups.jgroups212
            self._java[system] = build(self.progress)
        return self._java[system]

    def commands(
        self, system: str, w: Workload, count: int, rate: float, ports: list[int], cluster: str
    ) -> list[list[str]]:
        py = sys.executable
        opts = ["--senders", str(w.senders), "--count", str(count), "--size", str(w.size), "--rate", f"{rate:.3f}"]
        opts += ["--timeout", str(self.settings.timeout)]
        port_list = ",".join(map(str, ports))
        cmds = []
        for rank in range(w.members):
            if system == GROUPCLUSTER:
                stack = "fifo" if w.order == "fifo" else "total-order"
                base = [py, "-m", "groupcluster.bench.workers", "groupcluster", "--stack", stack, "--transport", "tcp"]
                cmds.append([*base, "--cluster", cluster, "--rank", str(rank), "--ports", port_list, *opts])
            elif system in (RAW, RAW_RELAY):
                relay = ["--relay"] if system == RAW_RELAY else []
                base = [py, "-m", "groupcluster.bench.workers", "raw", *relay]
                cmds.append([*base, "--rank", str(rank), "--ports", port_list, *opts])
            elif system in (JGROUPS5, JGROUPS212):
                peer = self._java_peer(system)
                cmds.append(peer.command(w.order, cluster, ports, rank, ["--members", str(w.members), *opts]))
            elif system == PYSYNCOBJ:
                ensure_pysyncobj(self.progress)
                base = [py, "-m", "groupcluster.bench.pysyncobj_worker", "--rank", str(rank), "--ports", port_list]
                cmds.append([*base, "--count", str(count), "--timeout", str(self.settings.timeout)])
            else:
                raise ValueError(f"unknown system {system!r}")
        return cmds

    # -- one run -----------------------------------------------------------------------------------------
    def run_once(self, system: str, w: Workload, count: int, rate: float = 0.0) -> list[RunReport]:
        self._runs += 1
        ports = free_ports(w.members)
        cluster = f"{self.settings.cluster_prefix}-{self._runs}"
        cmds = self.commands(system, w, count, rate, ports, cluster)
        logdir = Path(tempfile.mkdtemp(prefix="gc-bench-peers-"))
        lines: queue.Queue[tuple[int, str]] = queue.Queue()
        procs: list[subprocess.Popen[str]] = []
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        try:
            for rank, cmd in enumerate(cmds):
                err = open(logdir / f"member{rank}.err", "w")  # noqa: SIM115  # closed with the process
                p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
                procs.append(p)
                threading.Thread(target=_pump, args=(rank, p, lines), daemon=True).start()
            reports: dict[int, RunReport] = {}
            deadline = time.monotonic() + self.settings.timeout + 60
            while len(reports) < len(procs):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RunFailed(f"timed out with {len(reports)} of {len(procs)} results" + _tails(logdir))
                try:
                    rank, line = lines.get(timeout=min(left, 1.0))
                except queue.Empty:
                    # Quiet for a second: a member that died without a result fails the run at once.
                    dead = [i for i, p in enumerate(procs) if p.poll() is not None and i not in reports]
                    if dead:
                        msg = f"member {dead[0]} exited with {procs[dead[0]].returncode}" + _tails(logdir)
                        raise RunFailed(msg) from None
                    continue
                report = parse_result_line(line)
                if report is not None:
                    reports[rank] = report
            return [reports[i] for i in range(len(procs))]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()

    # -- a workload --------------------------------------------------------------------------------------
    def count_for(self, system: str, w: Workload) -> int:
        s = self.settings
        if w.order == "counter":
            return s.counter_ops
        per_sender = s.messages * w.members // w.senders
        return per_sender * (s.raw_factor if system in (RAW, RAW_RELAY) else 1)

    def measure(self, system: str, w: Workload) -> list[Result]:
        """The figure(s) of one system on one workload: the median of ``repeat`` runs."""
        if w.kind in LIFECYCLE_KINDS:
            return self.lifecycle.measure(system, w)
        reps = self.settings.repeat
        if w.kind == "throughput":
            samples = []
            for i in range(reps):
                value = throughput(self.run_once(system, w, self.count_for(system, w)))
                self.progress(f"  {w.name:<24} {system:<18} run {i + 1}/{reps}: {value:,.0f} {w.unit}")
                samples.append(value)
            result = aggregate(w.name, system, w.unit, samples)
            self.peaks[(w.name, system)] = result.value
            return [result]
        assert w.peak_of is not None
        peak = self.peaks.get((w.peak_of, system))
        if peak is None:
            raise RunFailed(f"no peak of {w.peak_of} for {system} in this run")
        # Half of the peak delivered rate, shared by the senders; every member delivers all senders' messages.
        rate = 0.5 * peak / w.senders
        count = max(int(rate * self.settings.latency_seconds), 100)
        p50s, p99s = [], []
        for i in range(reps):
            p50, p99 = latency(self.run_once(system, w, count, rate))
            self.progress(f"  {w.name:<24} {system:<18} run {i + 1}/{reps}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
            p50s.append(p50)
            p99s.append(p99)
        note = f"{rate * w.senders:,.0f} msgs/s sent in all, half of the peak {peak:,.0f}"
        return [
            aggregate(f"{w.name}-p50", system, LATENCY_UNIT, p50s, note),
            aggregate(f"{w.name}-p99", system, LATENCY_UNIT, p99s, note),
        ]


def _pump(rank: int, proc: subprocess.Popen[str], out: queue.Queue[tuple[int, str]]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        out.put((rank, line.rstrip("\n")))


def _tails(logdir: Path, lines: int = 6) -> str:
    parts = []
    for f in sorted(logdir.glob("member*.err")):
        text = f.read_text(errors="replace").strip().splitlines()[-lines:]
        if text:
            parts.append(f"\n  {f.name}:\n    " + "\n    ".join(text))
    return "".join(parts) + f"\n  (logs in {logdir})"


def ensure_pysyncobj(progress: Callable[[str], None]) -> None:
    """PySyncObj comes with the ``bench`` extra; install it into this interpreter when it is missing."""
    try:
        import pysyncobj  # noqa: F401
    except ImportError:
        progress("installing pysyncobj (the bench extra: pip install 'groupcluster[bench]')")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "pysyncobj>=0.3.12"], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RunFailed(
                "pysyncobj is missing and could not be installed; run: pip install 'groupcluster[bench]'\n"
                + done.stderr[-2000:]
            ) from None
