"""Run the join, state-transfer and grid workloads of the peers suite.

The grid workloads (our grid, Infinispan, Hazelcast) go to :mod:`groupcluster.bench.gridpeers_run`. For joins
and state transfer our side runs the standalone scripts of the repository's ``bench/`` folder as subprocesses
with ``--json`` (``join_latency.py``, ``state_transfer.py``), so the suite and the scripts measure one way;
:mod:`groupcluster.bench.figures` reads their output. The JGroups side runs the ``Lifecycle`` harness
(``bench/peers/jgroups``): member JVMs that print ``READY`` and ``VIEW n``, and one joiner JVM per round that
prints ``RESULT {json}`` and leaves. All on 127.0.0.1, one run at a time.

A script that overruns its time gets SIGINT first (its ``finally`` stops the members it started, some of which
run in their own sessions), then SIGKILL for its whole process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import figures
from .gridpeers_run import GridPeerRunner
from .jgroups import JavaPeer, harness_dir
from .model import GRID_PEER_KIND, GROUPCLUSTER, JGROUPS5, JGROUPS212, Result, Workload, aggregate, fmt_value

if TYPE_CHECKING:
    from .runner import Settings

# The light load on the members a joiner joins, as bench/join_latency.py's default.
JOIN_LOAD_RATE = 200
# Which harness configuration runs a lifecycle workload on a JVM system: a file of bench/peers/jgroups/conf
# (jgroups.CONFIGS) for JGroups 2.12; for JGroups 5, the jar's tcp-new.xml as shipped (it already holds
# pbcast.STATE_TRANSFER), written by the suite's ``jgroups5_config`` as for the multicast workloads.
JAVA_CONFIGS = {
    ("join", "fifo", JGROUPS5): "join",
    ("join", "vsync", JGROUPS212): "join-flush",
    ("state", "", JGROUPS5): "state",
}


class LifecycleFailed(Exception):
    """A script or harness run gave no figure; the message carries its last words."""


def bench_dir() -> Path:
    """The repository's ``bench/`` folder (the scripts live there, next to peers/jgroups)."""
    return harness_dir().parent.parent


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return f"\n  {path.name}:\n    " + "\n    ".join(text) if text else ""


def _stop_group(proc: subprocess.Popen[Any], grace: float) -> None:
    """SIGINT to the process group (the script's cleanup runs), then SIGKILL to what is left of it."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class LifecycleRunner:
    """Measures the lifecycle workloads; runs shared by workloads of one group happen once per repeat."""

    def __init__(
        self,
        settings: Settings,
        progress: Callable[[str], None],
        java_peer: Callable[[str], JavaPeer],
        free_ports: Callable[[int], list[int]],
        jgroups5_config: Callable[[str, str, Path], Path] | None = None,
    ) -> None:
        self.settings = settings
        self.progress = progress
        self.java_peer = java_peer
        self.jgroups5_config = jgroups5_config
        self.free_ports = free_ports
        self._docs: dict[tuple[str, str], list[Any]] = {}
        self._runs = 0
        # Our grid, Infinispan and Hazelcast: interleaved runs of their own (groupcluster.bench.gridpeers_run).
        self.grid_peers = GridPeerRunner(settings, progress, free_ports)

    def measure(self, system: str, w: Workload) -> list[Result]:
        if w.kind == GRID_PEER_KIND:
            return self.grid_peers.measure(system, w)
        docs = self._docs.get((w.run_group, system))
        if docs is None:
            docs = []
            for i in range(self.settings.repeat):
                t0 = time.monotonic()
                docs.append(self.run_once(system, w))
                self.progress(
                    f"  {w.run_group:<36} {system:<18} run {i + 1}/{self.settings.repeat} "
                    f"done in {time.monotonic() - t0:.0f}s"
                )
            self._docs[(w.run_group, system)] = docs
        samples = [self.figure(system, w, doc) for doc in docs]
        shown = ", ".join(fmt_value(s, w.unit) for s in samples)
        self.progress(f"  {w.name:<36} {system:<18} {shown} {w.unit}")
        return [aggregate(w.name, system, w.unit, samples, figures.note(system, w, docs))]

    # -- one run -----------------------------------------------------------------------------------------
    def run_once(self, system: str, w: Workload) -> Any:
        """The raw output of one run: a script's JSON object, or the JGroups joiners' RESULT objects."""
        self._runs += 1
        cluster = f"{self.settings.cluster_prefix}-l{self._runs}"
        if system == GROUPCLUSTER:
            return self._script(*self._script_args(w, cluster))
        if w.kind == "join":
            return self._java_join(system, w, cluster)
        if w.kind == "state":
            return self._java_state(system, w, cluster)
        raise LifecycleFailed(f"{w.name}: no way to run it on {system}")

    def figure(self, system: str, w: Workload, doc: Any) -> float:
        if w.kind == "join":
            if w.figure == "launch":
                return figures.join_launch_ms(doc) if system == GROUPCLUSTER else figures.java_join_launch_ms(doc)
            if w.figure == "warm":
                return figures.join_warm_ms(doc) if system == GROUPCLUSTER else figures.java_join_warm_ms(doc)
            return figures.join_ms(doc) if system == GROUPCLUSTER else figures.java_join_ms(doc)
        if w.kind == "state":
            if w.figure == "launch":
                return figures.state_launch_ms(doc) if system == GROUPCLUSTER else figures.java_state_launch_ms(doc)
            if w.figure == "warm":
                if system == GROUPCLUSTER:
                    return figures.state_warm_mb_per_s(doc, w.size)
                return figures.java_state_warm_mb_per_s(doc, w.size)
            if system == GROUPCLUSTER:
                return figures.state_mb_per_s(doc, w.size)
            return figures.java_state_mb_per_s(doc, w.size)
        raise LifecycleFailed(f"{w.name}: unknown kind {w.kind!r}")

    def _script_args(self, w: Workload, cluster: str) -> tuple[str, list[str]]:
        s = self.settings
        if w.kind == "join":
            args = ["--members", str(w.members - 1), "--rounds", str(s.join_rounds), "--stack", w.stack]
            if w.stack == "fifo":
                args += ["--warm-rounds", str(s.join_warm_rounds)]
            return "join_latency.py", [*args, "--transport", "tcp", "--rate", str(JOIN_LOAD_RATE), "--cluster", cluster]
        if w.kind == "state":
            # TCP like the JGroups peer; one member holds the state (the JGroups coordinator serves it too).
            args = ["--size-mb", f"{w.size / 1e6:g}", "--members", "1", "--transport", "tcp"]
            # Built just before the script starts: its launch_to_state_ms counts from here.
            args += ["--launch-wall-ms", str(int(time.time() * 1000))]
            return "state_transfer.py", [*args, "--repeat", str(s.state_repeat)]
        raise LifecycleFailed(f"{w.name}: unknown kind {w.kind!r}")

    def _script(self, name: str, args: list[str]) -> dict[str, Any]:
        script = bench_dir() / name
        if not script.is_file():
            raise LifecycleFailed(f"{script} not found (the suite runs the repository's bench scripts)")
        logdir = Path(tempfile.mkdtemp(prefix="gc-bench-lifecycle-"))
        err_path = logdir / f"{script.stem}.err"
        cmd = [sys.executable, str(script), *args, "--json"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True)
            try:
                out, _ = proc.communicate(timeout=self.settings.script_timeout)
            except subprocess.TimeoutExpired:
                _stop_group(proc, 60.0)
                raise LifecycleFailed(
                    f"{name} ran longer than {self.settings.script_timeout:g}s" + _tail(err_path) + f"\n  ({logdir})"
                ) from None
            finally:
                _stop_group(proc, 30.0)  # only if still running (Ctrl-C, SIGTERM of the suite)
        if proc.returncode != 0:
            raise LifecycleFailed(f"{name} exited with {proc.returncode}" + _tail(err_path) + f"\n  ({logdir})")
        return figures.script_json(out.decode(errors="replace"), name)

    # -- JGroups -----------------------------------------------------------------------------------------
    def _java_config(self, system: str, kind: str, name: str) -> str | Path:
        """JGroups 5: the path of the jar's file written for ``kind``; JGroups 2.12: the name in CONFIGS."""
        if system != JGROUPS5:
            return name
        if self.jgroups5_config is None:
            raise LifecycleFailed(f"{system}: no way to write the jar's configuration")
        return self.jgroups5_config(system, kind, Path(tempfile.mkdtemp(prefix="gc-bench-conf-")))

    def _java_join(self, system: str, w: Workload, cluster: str) -> list[dict[str, Any]]:
        config = JAVA_CONFIGS.get(("join", w.stack, system))
        if config is None:
            raise LifecycleFailed(f"{w.name}: no {system} configuration for a {w.stack} join")
        conf = self._java_config(system, "join", config)
        n, rounds = w.members, self.settings.join_rounds
        warm = self.settings.join_warm_rounds if w.stack == "fifo" else 0
        # A fresh port per joiner: JGroups 2.12 members take ~15 s to let a leaver's address go, and a joiner
        # reusing it waits that long (ours reuse one port; their clock starts after it is bound either way).
        ports = self.free_ports(n - 1 + rounds + (1 if warm else 0))
        with _JavaGroup(self.java_peer(system), conf, cluster, ports, self.progress) as group:
            group.start_members(n - 1, ["--rate", str(JOIN_LOAD_RATE)])
            results = []
            for r in range(rounds):
                launch = ["--launch-wall-ms", str(int(time.time() * 1000))]
                results.append(group.join(n, launch, f"joiner{r}", self.settings.script_timeout, n - 1 + r))
                group.wait_left(n - 1, 60.0)  # back to n-1 members before the next round
            if warm:
                # One JVM joins ``warm`` times (disconnect, connect): the warm figures, marked as such.
                for doc in group.join_repeated(n, warm, "joiner-warm", self.settings.script_timeout, n - 1 + rounds):
                    results.append({**doc, "warm": True})
            return results

    def _java_state(self, system: str, w: Workload, cluster: str) -> dict[str, Any]:
        config = JAVA_CONFIGS.get(("state", "", system))
        if config is None:
            raise LifecycleFailed(f"{w.name}: no {system} state configuration")
        conf = self._java_config(system, "state", config)
        # Both JVMs hold the state in their heaps, and STATE_TRANSFER copies it whole several times on the way
        # (the provider's ByteArrayOutputStream grows by doubling and is copied out; FRAG2 reassembles one
        # message; the joiner still holds its previous fetch): at 3 MB of heap per MB, 100 MB and 1 GB states
        # ran out of memory (OutOfMemoryError in JChannel.invokeCallback). JVM_OPTS' 512 MB is the floor.
        heap = ["-Xmx" + str(max(512, 6 * w.size // 1_000_000)) + "m"]
        with _JavaGroup(self.java_peer(system), conf, cluster, self.free_ports(2), self.progress, heap) as group:
            group.start_members(1, ["--state-bytes", str(w.size)])
            # One joiner JVM fetches ``state_repeat`` times: the first is the figure, the rest the warm figure.
            opts = ["--state-bytes", str(w.size), "--launch-wall-ms", str(int(time.time() * 1000))]
            done = group.join_repeated(2, self.settings.state_repeat, "joiner", self.settings.script_timeout, 1, opts)
            return {**done[0], "warm": done[1:]}


class _JavaGroup:
    """Member JVMs of one run (stdout read by threads: READY, VIEW n) and their joiners; all killed at exit."""

    def __init__(
        self,
        peer: JavaPeer,
        config: str | Path,
        cluster: str,
        ports: list[int],
        progress: Callable[[str], None],
        jvm_extra: list[str] | None = None,
    ) -> None:
        self.jvm_extra = jvm_extra or []
        self.peer = peer
        self.config = config
        self.cluster = cluster
        self.ports = ports
        self.progress = progress
        self.logdir = Path(tempfile.mkdtemp(prefix="gc-bench-lifecycle-"))
        self.procs: list[subprocess.Popen[str]] = []
        self.views: dict[int, int] = {}
        self.view_changes: dict[int, int] = {}
        self._changes_at_join: dict[int, int] = {}
        self.ready: set[int] = set()
        self.changed = threading.Condition()
        self.discover = 0

    def __enter__(self) -> _JavaGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()

    def _fail(self, what: str) -> LifecycleFailed:
        tails = "".join(_tail(f) for f in sorted(self.logdir.glob("*.err")))
        return LifecycleFailed(f"{self.peer.system}: {what}{tails}\n  (logs in {self.logdir})")

    def _watch(self, rank: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.strip()
            with self.changed:
                if line == "READY":
                    self.ready.add(rank)
                else:
                    size = figures.view_line(line)
                    if size is not None:
                        self.views[rank] = size
                        self.view_changes[rank] = self.view_changes.get(rank, 0) + 1
                self.changed.notify_all()

    def _wait(self, pred: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not pred():
                left = deadline - time.monotonic()
                dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
                if dead:
                    raise self._fail(f"member {dead[0]} exited with {self.procs[dead[0]].returncode} while {what}")
                if left <= 0:
                    raise self._fail(f"timed out while {what}")
                self.changed.wait(min(left, 0.5))

    def start_members(self, count: int, options: list[str]) -> None:
        """``count`` members on the first ports; returns once each has printed READY (a view of ``count``)."""
        self.discover = count
        for rank in range(count):
            opts = ["--members", str(count), *options]
            cmd = self.peer.lifecycle_command(
                self.config, self.cluster, self.ports, rank, "member", opts, count, self.jvm_extra
            )
            err = open(self.logdir / f"member{rank}.err", "w")  # noqa: SIM115  # closed with the process
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
            self.procs.append(proc)
            threading.Thread(target=self._watch, args=(rank, proc), daemon=True).start()
        self._wait(lambda: len(self.ready) == count, 120.0, f"waiting for {count} members to be READY")

    def wait_left(self, size: int, timeout: float) -> None:
        """Wait until every member has seen the last joiner come and go: two more views, the last of ``size``."""

        def back() -> bool:
            return all(
                self.views.get(i) == size and self.view_changes.get(i, 0) >= self._changes_at_join.get(i, 0) + 2
                for i in range(len(self.procs))
            )

        self._wait(back, timeout, f"waiting for the joiner to leave (views of {size})")

    def join_repeated(
        self, size: int, repeat: int, name: str, timeout: float, port_index: int, options: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """One joiner JVM that joins ``repeat`` times; after each result, once it has left, it is told ``next``."""
        opts = ["--members", str(size), "--repeat", str(repeat), *(options or [])]
        ports, config = self.ports, self.config
        cmd = self.peer.lifecycle_command(
            config, self.cluster, ports, port_index, "join", opts, self.discover, self.jvm_extra
        )
        with self.changed:
            self._changes_at_join = dict(self.view_changes)
        err = open(self.logdir / f"{name}.err", "w")  # noqa: SIM115  # closed below
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        results: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        # Reading its output blocks: a joiner that hangs without exiting is killed at the deadline, which ends
        # the read, instead of holding the suite for ever.
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.daemon = True
        watchdog.start()
        try:
            for line in proc.stdout:
                doc = figures.lifecycle_result(line.strip())
                if doc is None:
                    continue
                results.append(doc)
                self.wait_left(size - 1, max(1.0, min(60.0, deadline - time.monotonic())))
                if len(results) == repeat:
                    break
                with self.changed:
                    self._changes_at_join = dict(self.view_changes)
                proc.stdin.write("next\n")
                proc.stdin.flush()
            if len(results) < repeat:
                late = f" and ran longer than {timeout:g}s" if time.monotonic() >= deadline else ""
                raise self._fail(f"{name} gave {len(results)} of {repeat} results{late} (exit {proc.poll()})")
            return results
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            err.close()

    def join(self, size: int, options: list[str], name: str, timeout: float, port_index: int) -> dict[str, Any]:
        """Run one joiner JVM on ``ports[port_index]`` to its exit; its RESULT object."""
        opts = ["--members", str(size), *options]
        rank = port_index
        cmd = self.peer.lifecycle_command(
            self.config, self.cluster, self.ports, rank, "join", opts, self.discover, self.jvm_extra
        )
        with self.changed:
            self._changes_at_join = dict(self.view_changes)
        with open(self.logdir / f"{name}.err", "w") as err:
            try:
                done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise self._fail(f"{name} ran longer than {timeout:g}s") from None
        results = [r for r in map(figures.lifecycle_result, done.stdout.splitlines()) if r is not None]
        if done.returncode != 0 or not results:
            raise self._fail(f"{name} exited with {done.returncode} and {len(results)} RESULT lines")
        return results[-1]
