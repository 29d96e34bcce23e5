"""Run the peers suite: every system's member processes on loopback, in interleaved rounds.

(The join, state-transfer and grid workloads go to :class:`groupcluster.bench.lifecycle.LifecycleRunner`, which
hands the grid ones to :class:`groupcluster.bench.gridpeers_run.GridPeerRunner`.)

For a multicast or counter workload, :meth:`Runner.measure_interleaved` starts every system's N member
processes on 127.0.0.1 (Python workers, member JVMs on JGroups' own shipped XML, JGroups' MPerf, or PySyncObj
nodes) and keeps them up: W warm-up rounds and R measured rounds run in the same processes, the systems taking
turns round by round (:func:`groupcluster.bench.fair.interleave`), only one system sending at a time. Each
round gives a figure, the CPU of all the system's processes per delivered message, and the load before it; the
median and spread of the measured rounds are the result. Afterwards the members are killed (SIGKILL: nobody
leaves while another still needs it, and teardown is not measured).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import compiled
from . import jgroups
from .fair import address_properties, config_diff, cpu_per_message_us, interleave, jgroups_config, summarize
from .lifecycle import LifecycleRunner
from .model import (
    GROUPCLUSTER,
    GROUPCLUSTER_PURE,
    JGROUPS5,
    JGROUPS5_MPERF,
    JGROUPS5_STOCK,
    JGROUPS5_TUNED,
    JGROUPS5_VARIANTS,
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
    throughput,
)
from .rounds import MemberSet, MPerfSet, RoundFailed

# A replicated-counter round shorter than this is flagged: too short to say much about a Raft peer.
MIN_COUNTER_SECONDS = 5.0


class RunFailed(Exception):
    """A run did not produce a result from every member; the message carries the members' last words."""


@dataclass
class Settings:
    """How much each run sends (the same for every system of a workload) and how often runs repeat."""

    # Per sender when all send; a lone sender sends members * messages. Long rounds, so start-up, JIT and
    # scheduling noise are small against the measured window.
    messages: int = 200_000
    # Increments per node and round in replicated-counter-3: long enough that PySyncObj's rounds last well over
    # 5 s here (a round shorter than MIN_COUNTER_SECONDS is flagged in the result's note).
    counter_ops: int = 50_000
    counter_window: int = 1000  # increments in flight per node, for both systems
    raw_factor: int = 1  # raw asyncio sends what every other system sends
    repeat: int = 5  # measured rounds per system (multicast workloads) or runs (lifecycle workloads)
    warmup: int = 2  # discarded rounds before them, in the same processes
    mperf_seconds: int = 20  # length of one MPerf round (it measures for a fixed time)
    tcp_bundler_capacity: int = 262_144  # the stated tuning of the jgroups-5-tcp-capacity row (stock: 16384)
    # Threads that send a JGroups member's unpaced messages (message i by thread i % N), as JGroups applications
    # and MPerf (100) send; our members send from their one event loop. Paced runs send from one thread.
    jgroups_threads: int = 8
    latency_seconds: float = 4.0
    timeout: float = 180.0
    join_rounds: int = 3  # joins per run of join-4 / join-flush-4 (the run's figure is their median)
    state_repeat: int = 4  # state fetches per state run from one process: the first, then the warm ones
    join_warm_rounds: int = 5  # join-4-warm: joins from one process (the first, cold in that process, left out)
    rebalance_idle_seconds: float = 3.0  # grid-rebalance-3to4*: writes on the idle grid before the 4th member starts
    grid_single_ops: int = 1000  # keys per client and pass, one per request (grid-ops-single-put/-get)
    grid_batch_ops: int = 20000  # keys per client and pass, in batches of 1000 (grid-ops-batch-put/-get)
    grid_entries: int = 0  # entries grid-rebalance-3to4* loads; 0: the workload's size (--quick: 50,000)
    # The systems chosen with --systems (empty: all): a grid group's runs interleave all of them from the start.
    systems: tuple[str, ...] = ()
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
        self.config_diffs: dict[str, dict[str, str]] = {}
        self.lifecycle = LifecycleRunner(settings, progress, self._java_peer, free_ports, self.jgroups5_config)

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
            if system in (GROUPCLUSTER, GROUPCLUSTER_PURE):
                stack = "fifo" if w.order == "fifo" else "total-order"
                pure = ["env", f"{compiled.PURE_ENV}=1"] if system == GROUPCLUSTER_PURE else []
                base = [*pure, py, "-m", "groupcluster.bench.workers", "groupcluster", "--stack", stack]
                base += ["--transport", "tcp"]
                cmds.append([*base, "--cluster", cluster, "--rank", str(rank), "--ports", port_list, *opts])
            elif system in (RAW, RAW_RELAY):
                relay = ["--relay"] if system == RAW_RELAY else []
                base = [py, "-m", "groupcluster.bench.workers", "raw", *relay]
                cmds.append([*base, "--rank", str(rank), "--ports", port_list, *opts])
            elif system in (JGROUPS5, JGROUPS212):
                peer = self._java_peer(system)
                jopts = ["--members", str(w.members), *opts, "--threads", str(self.settings.jgroups_threads)]
                cmds.append(peer.command(w.order, cluster, ports, rank, jopts))
            elif system == PYSYNCOBJ:
                ensure_pysyncobj(self.progress)
                base = [py, "-m", "groupcluster.bench.pysyncobj_worker", "--rank", str(rank), "--ports", port_list]
                cmds.append([*base, "--count", str(count), "--timeout", str(self.settings.timeout)])
            else:
                raise ValueError(f"unknown system {system!r}")
        return cmds

    # -- one run -----------------------------------------------------------------------------------------
    def run_once(self, system: str, w: Workload, count: int, rate: float = 0.0) -> list[RunReport]:
        """One round in fresh processes (no warm-up): for scripts such as bench/latency.py, not the suite."""
        ms = self.member_set(system, w, count, rate)
        try:
            ms.start(timeout=120.0)
            return ms.run_round(1, timeout=self.settings.timeout).reports
        except RoundFailed as exc:
            raise RunFailed(str(exc)) from None
        finally:
            ms.close()

    # -- a workload --------------------------------------------------------------------------------------
    def count_for(self, system: str, w: Workload) -> int:
        s = self.settings
        if w.order == "counter":
            return s.counter_ops
        per_sender = s.messages * w.members // w.senders
        return per_sender * (s.raw_factor if system in (RAW, RAW_RELAY) else 1)

    def measure(self, system: str, w: Workload) -> list[Result]:
        """The figure(s) of one system on one workload (the suite measures all systems of a workload at once)."""
        if w.kind in LIFECYCLE_KINDS:
            return self.lifecycle.measure(system, w)
        results, failures = self.measure_interleaved(w, [system])
        if failures:
            raise RunFailed("; ".join(failures))
        return results

    # -- the fair suite: interleaved rounds in long-lived processes --------------------------------------
    def jgroups5_config(self, system: str, order: str, workdir: Path) -> Path:
        """Write the jar's XML for ``system`` (SEQUENCER for total order, capacity where stated); record the diff."""
        name, tuned = JGROUPS5_VARIANTS[system]
        peer = self._java_peer(JGROUPS5)
        stock = jgroups.stock_xml(peer, name)
        used = jgroups_config(
            stock,
            sequencer=order in ("total-order", "counter"),
            bundler_capacity=self.settings.tcp_bundler_capacity if tuned else None,
        )
        path = workdir / f"{system}-{order}.xml"
        path.write_text(used)
        key = f"{system}/{order}"
        if key not in self.config_diffs:
            diff = config_diff(stock, used, name)
            props = "jgroups.bind_addr=127.0.0.1, jgroups.bind_port=<member's port>, "
            props += "jgroups.tcpping.initial_hosts=<every member's port>, jgroups.tcp.port_range=0"
            self.config_diffs[key] = {"file": name, "diff": diff, "system_properties": props}
            shown = diff if diff else "  (no change to the file)\n"
            self.progress(f"  {key}: jar's {name}, addresses via system properties ({props}); diff:\n{shown}")
        return path

    def member_set(self, system: str, w: Workload, count: int, rate: float) -> MemberSet:
        """Start ``system``'s members for ``w`` (not yet ready: the caller calls ``start``)."""
        self._runs += 1
        ports = free_ports(w.members)
        cluster = f"{self.settings.cluster_prefix}-{self._runs}"
        workdir = Path(tempfile.mkdtemp(prefix="gc-bench-conf-"))
        if system in JGROUPS5_VARIANTS:
            conf = self.jgroups5_config(system, w.order, workdir)
            peer = self._java_peer(JGROUPS5)
            cmds = []
            for rank in range(w.members):
                props = [f"-D{k}={v}" for k, v in address_properties(ports, rank).items()]
                base = ["java", *jgroups.JVM_OPTS, *props, "-cp", peer.classpath]
                if system == JGROUPS5_MPERF:
                    args = ["-props", str(conf), "-name", f"m{rank}", "-size", str(w.size)]
                    args += ["-time", str(self.settings.mperf_seconds)]
                    cmds.append([*base, "org.jgroups.tests.perf.MPerf", *args, *(["-nohup"] if rank else [])])
                else:
                    opts = ["--members", str(w.members), "--senders", str(w.senders), "--count", str(count)]
                    opts += ["--size", str(w.size), "--rate", f"{rate:.3f}", "--timeout", str(self.settings.timeout)]
                    opts += ["--threads", str(self.settings.jgroups_threads)]
                    cmds.append([*base, peer.main_class, str(conf), cluster, "--rank", str(rank), *opts])
            return (MPerfSet if system == JGROUPS5_MPERF else MemberSet)(system, cmds)
        cmds = self.commands(system, w, count, rate, ports, cluster)
        if w.order == "counter" and system == GROUPCLUSTER:
            cmds = [[*c, "--window", str(self.settings.counter_window)] for c in cmds]
        if system == PYSYNCOBJ:
            cmds = [[*c, "--window", str(self.settings.counter_window)] for c in cmds]
        return MemberSet(system, cmds)

    def measure_interleaved(self, w: Workload, systems: list[str]) -> tuple[list[Result], list[str]]:
        """Every system of ``w`` up at once; W warm-up then R measured rounds, systems taking turns per round."""
        s = self.settings
        rate_of: dict[str, float] = {}
        if w.kind == "latency":
            assert w.peak_of is not None
            for system in systems:
                peak = self.peaks.get((w.peak_of, system))
                if peak is not None:
                    rate_of[system] = 0.5 * peak / w.senders
        failures: list[str] = []
        sets: dict[str, MemberSet] = {}
        results: list[Result] = []
        try:
            for system in systems:
                if w.kind == "latency" and system not in rate_of:
                    failures.append(f"{w.name} / {system}: no peak of {w.peak_of} in this run")
                    continue
                rate = rate_of.get(system, 0.0)
                count = max(int(rate * s.latency_seconds), 100) if rate else self.count_for(system, w)
                try:
                    if system == PYSYNCOBJ:
                        ensure_pysyncobj(self.progress)
                    ms = self.member_set(system, w, count, rate)
                    sets[system] = ms
                    ms.start(timeout=120.0)
                except Exception as exc:  # one peer failing must not lose the others' figures
                    failures.append(f"{w.name} / {system}: did not start: {exc}")
                    self.progress(f"  {w.name:<24} {system:<22} FAILED to start: {exc}")
                    sets.pop(system, None)
            rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in sets}
            for round_no, system, measured in interleave(list(sets), s.warmup, s.repeat):
                current = sets.get(system)
                if current is None:  # failed in an earlier round
                    continue
                ms = current
                load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
                cpu0 = ms.cpu()
                t0 = time.monotonic()
                try:
                    outcome = ms.run_round(round_no, timeout=s.timeout + (s.mperf_seconds * 3))
                    wall = time.monotonic() - t0
                    cpu = cpu_per_message_us(cpu0, ms.cpu(), outcome.delivered)
                    entry = self._round_figures(w, system, round_no, outcome, wall, load, cpu, measured)
                except (RoundFailed, ValueError) as exc:
                    why = str(exc)
                    if system == JGROUPS5_STOCK:
                        why += (
                            "\n  (stock tcp.xml: its transfer-queue bundler drops messages when its queue is full "
                            "and retransmission then dominates; see the jgroups-5-tcp-capacity row)"
                        )
                    failures.append(f"{w.name} / {system}: round {round_no} failed: {why}")
                    self.progress(f"  {w.name:<24} {system:<22} round {round_no} FAILED: {why}")
                    ms.close()
                    sets.pop(system)
                    continue
                rounds[system].append(entry)
            for system, entries in rounds.items():
                kept = [e for e in entries if e["measured"]]
                if not kept or system not in sets:
                    continue
                results.extend(self._round_results(w, system, kept, rate_of.get(system, 0.0)))
        finally:
            for ms in sets.values():
                ms.close()
        return results, failures

    def _round_figures(
        self,
        w: Workload,
        system: str,
        round_no: int,
        outcome: Any,
        wall: float,
        load: float,
        cpu: float | None,
        measured: bool,
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {"round": round_no, "measured": measured, "load": load, "cpu_us": cpu, "wall": wall}
        tag = "" if measured else " (warm-up)"
        if w.kind == "latency":
            p50, p99 = latency(outcome.reports)
            entry.update(p50=p50, p99=p99)
            text = f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
        else:
            value = outcome.value if outcome.value is not None else throughput(outcome.reports)
            entry["value"] = value
            text = f"{value:,.0f} {w.unit}"
        if w.order == "counter":
            expect = round_no * w.members * self.settings.counter_ops
            values = [d.get("value") for d in outcome.data]
            if any(v != expect for v in values):
                raise RoundFailed(f"{system}: counter values {values} after round {round_no}, expected {expect}")
            text += f", every node's counter {expect:,}"
        cpu_text = "" if cpu is None else f", {cpu:.2f} us CPU/msg"
        self.progress(
            f"  {w.name:<24} {system:<22} round {round_no}{tag}: {text}{cpu_text} ({wall:.1f} s, load {load:.2f})"
        )
        return entry

    def _round_results(self, w: Workload, system: str, measured: list[dict[str, Any]], rate: float) -> list[Result]:
        cpus = [e["cpu_us"] for e in measured if e["cpu_us"] is not None]
        loads = [e["load"] for e in measured]
        cpu_median = summarize(cpus)["median"] if cpus else None

        def result(name: str, unit: str, samples: list[float], note: str) -> Result:
            r = aggregate(name, system, unit, samples, note)
            r.spread = summarize(samples)
            r.cpu_us_per_message = cpu_median
            r.cpu_samples = cpus
            r.load_before = loads
            return r

        if w.kind == "latency":
            note = f"{rate * w.senders:,.0f} msgs/s sent in all, half of the peak"
            return [
                result(f"{w.name}-p50", LATENCY_UNIT, [e["p50"] for e in measured], note),
                result(f"{w.name}-p99", LATENCY_UNIT, [e["p99"] for e in measured], note),
            ]
        note = ""
        if w.order == "counter":
            short = [e["wall"] for e in measured if e["wall"] < MIN_COUNTER_SECONDS]
            if short:
                note = f"{len(short)} round(s) shorter than {MIN_COUNTER_SECONDS:g} s: raise --counter-ops"
        if (system in JGROUPS5_VARIANTS and system != JGROUPS5_MPERF) or system == JGROUPS212:
            threads = 1 if rate else self.settings.jgroups_threads
            note = f"{threads} sender thread{'s' if threads != 1 else ''} per member"
        if system == JGROUPS5_TUNED:
            note += f"; stated tuning: TCP bundler.capacity={self.settings.tcp_bundler_capacity} (stock 16384)"
        if system == JGROUPS5_MPERF:
            seq = " with SEQUENCER" if w.order == "total-order" else ""
            note = f"JGroups' MPerf on tcp-new.xml{seq}, {self.settings.mperf_seconds} s per round, 100 sender threads"
        r = result(w.name, w.unit, [e["value"] for e in measured], note)
        self.peaks[(w.name, system)] = r.value
        return [r]


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
