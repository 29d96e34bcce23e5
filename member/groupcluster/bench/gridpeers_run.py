"""Run the grid workloads of the peers suite: our grid, Infinispan and Hazelcast, the same way, interleaved.

A **run** is one system from start to stop, on 127.0.0.1:

* rebalance (``grid-rebalance-3to4*``): 3 members, the load (batched puts), a writer process at 200 single
  PUTs/s through the system's remote client (ours: :class:`~groupcluster.grid.client.GridClient` over HTTP;
  Hazelcast: its Java client; Infinispan: Hot Rod), a **discarded warm-up rebalance** (a 4th member joins, the
  grid settles, it leaves, the grid settles), the idle window of writes, then the measured join: MB/s and
  entries/s from the joiner's first view to the last member's balanced state, the writes' p99 idle and during,
  and the CPU time (user+sys from ``/proc``) of all member processes over the move, per MB;
* operations (``grid-ops-*``): 3 members and 4 client processes; every step (single put/get, batched put/get)
  once as a discarded warm-up pass, then once measured: ops/s of all clients, the request p50/p99, and the
  members' CPU per operation.

Runs go round by round, the systems taking turns within a round, so a slow stretch of the shared machine hits
every system alike; each figure is the median of the rounds, with its spread. The peers' JVMs come from
``bench/peers/grid`` (built with Maven into ``~/.cache/groupcluster/bench`` on first use, offline first).
"""

from __future__ import annotations

import abc
import contextlib
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import jgroups
from .gridpeers import (
    BASE_SYSTEM,
    CLIENT_JVM_OPTS,
    KEY_BYTES,
    MEMBER_JVM_OPTS,
    OPS_STEPS,
    HarnessError,
    OpsStep,
    RebalanceRun,
    StateLine,
    end_of_rebalance,
    entries_moved,
    grid_result,
    hazelcast_xml,
    infinispan_properties,
    infinispan_xml,
    parse_done,
    parse_list,
    parse_state,
    parse_view,
    system_note,
)
from .model import (
    CPU_PER_MB_UNIT,
    CPU_PER_OP_UNIT,
    GROUPCLUSTER,
    HAZELCAST_TUNED,
    INFINISPAN,
    INFINISPAN_TUNED,
    LATENCY_UNIT,
    Result,
    Workload,
)

if TYPE_CHECKING:
    from .runner import Settings

VALUE_SIZE = 100
WRITE_RATE = 200.0
SINGLE_INFLIGHT = 16
BATCH_INFLIGHT = 8
BATCH_KEYS = 1000
_TICK = os.sysconf("SC_CLK_TCK")
ENTRIES_RECEIVED = "groupcluster_grid_rebalance_entries_received_total"
BYTES_RECEIVED = "groupcluster_grid_rebalance_bytes_received_total"


class GridPeerFailed(Exception):
    """A run of a grid system gave no figure; the message says where it stopped and where its logs are."""


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process (all its threads) used so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def cpu_of(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


# -- building the JVM harness ---------------------------------------------------------------------------------
def harness_dir() -> Path:
    return jgroups.harness_dir().parent / "grid"


def build(log: Callable[[str], None] | None = None) -> str:
    """The class path of the grid harness, built with Maven on first use (a folder per source hash)."""
    src = harness_dir()
    files = [src / "pom.xml", *(src / "src").rglob("*.java")]
    return jgroups.maven_classpath(src, files, "grid", "grid-peers.jar", "the grid peers (Infinispan, Hazelcast)", log)


# -- one process speaking the harness's lines -----------------------------------------------------------------
class LineProc:
    """A member or client process: commands on stdin; VIEW/STATE lines kept, other lines answer commands."""

    def __init__(self, name: str, cmd: list[str], logdir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.err_path = logdir / f"{name}.err"
        self._err = open(self.err_path, "w")  # noqa: SIM115  # closed in close()
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True, env=env
        )
        self.views: list[tuple[float, int]] = []
        self.states: list[StateLine] = []
        self.answers: queue.Queue[str] = queue.Queue()
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            view = parse_view(line)
            state = parse_state(line) if view is None else None
            with self.lock:
                if view is not None:
                    self.views.append(view)
                elif state is not None:
                    self.states.append(state)
                else:
                    self.answers.put(line)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GridPeerFailed(f"{self.name}: no {prefix} within {timeout:g}s" + self.tail())
            try:
                line = self.answers.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise GridPeerFailed(f"{self.name} exited with {self.proc.returncode}" + self.tail()) from None
                continue
            if line.startswith(prefix):
                return line
            if line.startswith("ERROR"):
                raise GridPeerFailed(f"{self.name}: {line}" + self.tail())

    def ask(self, command: str, prefix: str, timeout: float = 120.0) -> str:
        self.send(command)
        return self.expect(prefix, timeout)

    def tail(self, lines: int = 8) -> str:
        try:
            text = self.err_path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n  {self.err_path}:\n    " + "\n    ".join(text) if text else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._err.close()


# -- the systems under test -----------------------------------------------------------------------------------
class Grid(abc.ABC):
    """What the workloads need of a grid; one instance per run."""

    system: str

    @abc.abstractmethod
    def start(self, n: int) -> None: ...
    @abc.abstractmethod
    def load(self, entries: int, size: int) -> None: ...
    @abc.abstractmethod
    def member_pids(self) -> list[int]: ...
    @abc.abstractmethod
    def client_cmd(self) -> list[str]: ...
    @abc.abstractmethod
    def join(self) -> tuple[float, float]: ...  # (spawned at, joined at), seconds since the epoch
    @abc.abstractmethod
    def wait_balanced(self, n: int, since: float, at_end: Callable[[], None]) -> float: ...
    @abc.abstractmethod
    def leave_newest(self, stay: bool = False) -> None: ...
    @abc.abstractmethod
    def moved_before(self, entries: int) -> None: ...
    @abc.abstractmethod
    def moved_after(self) -> tuple[int, float]: ...
    @abc.abstractmethod
    def close(self) -> None: ...


def _metric_sum(urls: list[str], name: str) -> float:
    total = 0.0
    for u in urls:
        with urllib.request.urlopen(u + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    total += float(line.split()[1])
    return total


class OurGrid(Grid):
    """``groupcluster member --grid --http`` processes (the ``groupcluster local`` machinery)."""

    system = GROUPCLUSTER

    def __init__(self, workdir: Path) -> None:
        from ..tools.local_cluster import LocalCluster

        self.cluster = LocalCluster(workdir / "cluster")
        self._before = (0.0, 0.0)

    def urls(self, n: int = 3) -> list[str]:
        return [m.http for m in self.cluster.members[:n]]

    def start(self, n: int) -> None:
        self.cluster.start(n, timeout=300.0)

    def load(self, entries: int, size: int) -> None:
        from ..grid.client import GridClient

        value = b"v" * size
        with GridClient(self.urls(), timeout=120.0, batch_size=2000) as c:
            for start in range(0, entries, 50_000):
                c.put_many({f"bulk-{i:07d}".encode(): value for i in range(start, min(entries, start + 50_000))})

    def member_pids(self) -> list[int]:
        return [m.pid for m in self.cluster.members]

    def client_cmd(self) -> list[str]:
        return [sys.executable, "-m", "groupcluster.bench.gridpeers_client", *self.urls()]

    def join(self) -> tuple[float, float]:
        """Start a member; its join time is the last status poll that said it had *not* joined yet.

        Our members report no time of their first view, so the join lies between a poll answered "not joined"
        and the next one answered "joined"; taking the earlier one errs against us (a longer rebalance), by at
        most one poll (5 ms) and a status request, where the peers' members print their view's time.
        """
        from ..tools.local_cluster import get_json

        t_spawn = time.time()
        rec = self.cluster.spawn()
        last_not_joined = t_spawn
        deadline = time.monotonic() + 600.0
        while time.monotonic() < deadline:
            if not self.cluster.alive(rec):
                raise GridPeerFailed(f"{rec.name} exited before it joined:\n{self.cluster.log_tail(rec)}")
            st = get_json(rec.http + "/v1/status", timeout=1.0)
            if st and st.get("joined"):
                return t_spawn, last_not_joined
            last_not_joined = time.time()
            time.sleep(0.005)
        raise GridPeerFailed(f"{rec.name} did not join within 600 s (log: {rec.log})")

    def wait_balanced(self, n: int, since: float, at_end: Callable[[], None]) -> float:
        self.cluster.wait_settled("the rebalance", 900, None)
        at_end()
        statuses = self.cluster.statuses().values()
        installed = [((st or {}).get("grid") or {}).get("topology_installed_at") for st in statuses]
        return max((float(t) for t in installed if t), default=time.time())

    def leave_newest(self, stay: bool = False) -> None:
        # A Python member has no compiled code to keep warm: the next joiner is a new process either way.
        self.cluster.scale(len(self.cluster.members) - 1)

    def moved_before(self, entries: int) -> None:
        urls = [m.http for m in self.cluster.members]
        self._before = (_metric_sum(urls, ENTRIES_RECEIVED), _metric_sum(urls, BYTES_RECEIVED))

    def moved_after(self) -> tuple[int, float]:
        urls = [m.http for m in self.cluster.members]
        e = _metric_sum(urls, ENTRIES_RECEIVED) - self._before[0]
        b = _metric_sum(urls, BYTES_RECEIVED) - self._before[1]
        return int(e), b

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.cluster.stop(grace=5.0)
        self.cluster.kill_all()


class JvmGrid(Grid):
    """Infinispan or Hazelcast members, one JVM each (``GridPeer member``), on ports chosen free."""

    SLOTS = 6  # 3 members and up to 3 joiners, each on its own port

    def __init__(
        self, system: str, classpath: str, workdir: Path, cluster: str, free_ports: Callable[[int], list[int]]
    ) -> None:
        self.system = system
        self.base = BASE_SYSTEM[system]
        self.tuned = system in (INFINISPAN_TUNED, HAZELCAST_TUNED)
        self.classpath = classpath
        self.workdir = workdir
        self.cluster = cluster
        ports = free_ports(self.SLOTS * 2)
        self.ports, self.client_ports = ports[: self.SLOTS], ports[self.SLOTS :]
        self.members: list[LineProc] = []
        self.parked: LineProc | None = None  # a member JVM that left but stays up, to join again warm
        self.started = 0
        self._counts: list[int] = []
        self._before: dict[str, list[int]] = {}

    def _member_cmd(self, slot: int) -> list[str]:
        name = f"{self.base}-m{slot}"
        conf = self.workdir / f"{name}.xml"
        props: list[str] = []
        if self.base == INFINISPAN:
            conf.write_text(infinispan_xml(self.cluster, name, self.ports, self.tuned))
            props = infinispan_properties(self.ports[slot])
            extra = [str(self.client_ports[slot])]
        else:
            conf.write_text(hazelcast_xml(self.cluster, self.ports[slot], self.ports, self.tuned))
            extra = []
        main = ["-cp", self.classpath, "io.groupcluster.bench.grid.GridPeer"]
        return ["java", *MEMBER_JVM_OPTS, *props, *main, "member", self.base, str(conf), name, *extra]

    def _spawn(self) -> LineProc:
        slot = self.started
        if slot >= self.SLOTS:
            raise GridPeerFailed(f"{self.system}: more than {self.SLOTS} members in one run")
        self.started += 1
        p = LineProc(f"{self.base}-m{slot}", self._member_cmd(slot), self.workdir)
        self.members.append(p)
        return p

    def start(self, n: int) -> None:
        procs = [self._spawn() for _ in range(n)]
        for p in procs:
            p.expect("READY", 180.0)
        self.wait_balanced(n, 0.0, lambda: None, 300.0)

    def load(self, entries: int, size: int) -> None:
        self.members[0].ask(f"LOAD {entries} {size}", "LOADED", 1800.0)
        counts = self.members[0].ask(f"SEGCOUNTS {entries}", "SEGCOUNTS")
        self._counts = [int(c) for c in parse_list(counts, "SEGCOUNTS")]

    def member_pids(self) -> list[int]:
        return [m.pid for m in self.members]

    def client_cmd(self) -> list[str]:
        main = ["-cp", self.classpath, "io.groupcluster.bench.grid.GridPeer", "client", self.base]
        if self.base == INFINISPAN:
            hosts = ";".join(f"127.0.0.1:{p}" for p in self.client_ports[:3])
        else:
            hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports[:3])
        return ["java", *CLIENT_JVM_OPTS, *main, self.cluster, hosts]

    def join(self) -> tuple[float, float]:
        """A 4th member joins: the JVM of the last leaver when one stays up (warm), else a new JVM."""
        n = len(self.members) + 1
        t_spawn = time.time()
        if self.parked is not None:
            joiner, self.parked = self.parked, None
            with joiner.lock:
                joiner.views.clear()
                joiner.states.clear()
            self.members.append(joiner)
            joiner.send("JOIN")
        else:
            joiner = self._spawn()
        deadline = time.monotonic() + 300.0
        while time.monotonic() < deadline:
            seen = [t for m in self.members for t, size in list(m.views) if size == n and t >= t_spawn]
            if seen:
                return t_spawn, min(seen)
            if joiner.proc.poll() is not None:
                raise GridPeerFailed(f"{joiner.name} exited with {joiner.proc.returncode}" + joiner.tail())
            time.sleep(0.005)
        raise GridPeerFailed(f"{self.system}: the joiner was not in a view within 300 s" + joiner.tail())

    def wait_balanced(self, n: int, since: float, at_end: Callable[[], None], timeout: float = 900.0) -> float:
        """Wait for :func:`end_of_rebalance`, then for 1 s without a change and the peer's own "safe" check."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.members:
                if m.proc.poll() is not None:
                    raise GridPeerFailed(f"{m.name} exited with {m.proc.returncode}" + m.tail())
            states = {m.name: list(m.states) for m in self.members}
            done = end_of_rebalance(states, n, since)
            if done is None:
                time.sleep(0.005)
                continue
            at_end()
            counts = {k: len(v) for k, v in states.items()}
            time.sleep(1.0)
            if {m.name: len(m.states) for m in self.members} != counts:
                continue  # it moved on: not the end yet
            if self.members[0].ask("SAFE", "SAFE") != "SAFE true":
                continue
            return done
        last = {m.name: m.states[-1] if m.states else None for m in self.members}
        raise GridPeerFailed(f"{self.system}: not balanced within {timeout:g} s; last states {last}")

    def owned(self) -> dict[str, list[int]]:
        return {m.name: [int(s) for s in parse_list(m.ask("OWNED", "OWNED"), "OWNED")] for m in self.members}

    def leave_newest(self, stay: bool = False) -> None:
        """The newest member leaves gracefully; ``stay``: its JVM stays up for the next :meth:`join`."""
        leaver = self.members.pop()
        if stay:
            leaver.ask("LEAVE stay", "LEFT", 300.0)
            self.parked = leaver
        else:
            leaver.send("LEAVE")
            try:
                leaver.proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                raise GridPeerFailed(f"{leaver.name} did not leave within 300 s" + leaver.tail()) from None
            leaver.close()
        self.wait_balanced(len(self.members), time.time(), lambda: None)

    def moved_before(self, entries: int) -> None:
        self._before = self.owned()

    def moved_after(self) -> tuple[int, float]:
        moved = entries_moved(self._before, self.owned(), self._counts)
        return moved, moved * (KEY_BYTES + VALUE_SIZE)

    def close(self) -> None:
        for m in [*self.members, *([self.parked] if self.parked else [])]:
            m.close()


# -- the workloads --------------------------------------------------------------------------------------------
class GridPeerRunner:
    """Runs the grid groups round by round, the chosen systems taking turns; caches the figures per group."""

    def __init__(
        self, settings: Settings, progress: Callable[[str], None], free_ports: Callable[[int], list[int]]
    ) -> None:
        self.settings = settings
        self.progress = progress
        self.free_ports = free_ports
        self._classpath = ""
        self._figures: dict[tuple[str, str], list[Any]] = {}
        self._failed: dict[tuple[str, str], str] = {}
        self._done: set[str] = set()
        self._runs = 0

    def classpath(self) -> str:
        if not self._classpath:
            self._classpath = build(self.progress)
        return self._classpath

    def entries(self, w: Workload) -> int:
        return self.settings.grid_entries or w.size

    def measure(self, system: str, w: Workload) -> list[Result]:
        group = w.run_group
        if group not in self._done:
            self._done.add(group)
            chosen = [s for s in w.systems if not self.settings.systems or s in self.settings.systems]
            self._run_group(group, w, chosen)
        if (group, system) in self._failed:
            raise GridPeerFailed(self._failed[(group, system)])
        runs = self._figures.get((group, system), [])
        if not runs:
            raise GridPeerFailed(f"{w.name}: no run of {system}")
        return self._results(system, w, runs)

    def _run_group(self, group: str, w: Workload, systems: list[str]) -> None:
        reps = self.settings.repeat
        for r in range(reps):
            for system in systems:
                if (group, system) in self._failed:
                    continue
                t0 = time.monotonic()
                try:
                    figs = self.rebalance_run(system, w) if group == "grid-rebalance" else self.ops_run(system, w)
                except Exception as exc:  # one peer failing must not lose the others' figures
                    self._failed[(group, system)] = f"{group} / {system}: {exc}"
                    self.progress(f"  {group:<24} {system:<18} FAILED: {exc}")
                    continue
                self._figures.setdefault((group, system), []).append(figs)
                self.progress(
                    f"  {group:<24} {system:<18} run {r + 1}/{reps} in {time.monotonic() - t0:.0f}s: {_brief(figs)}"
                )

    def _grid(self, system: str, workdir: Path) -> Grid:
        self._runs += 1
        if system == GROUPCLUSTER:
            return OurGrid(workdir)
        cluster = f"{self.settings.cluster_prefix}-g{self._runs}"
        return JvmGrid(system, self.classpath(), workdir, cluster, self.free_ports)

    def rebalance_run(self, system: str, w: Workload) -> dict[str, float]:
        entries = self.entries(w)
        workdir = Path(tempfile.mkdtemp(prefix=f"gc-bench-grid-{system}-"))
        grid = self._grid(system, workdir)
        writer: LineProc | None = None
        try:
            grid.start(3)
            grid.load(entries, VALUE_SIZE)
            writer = LineProc(f"{system}-writer", grid.client_cmd(), workdir)
            writer.expect("READY", 180.0)
            writer.ask(f"WRITE {WRITE_RATE:g} {VALUE_SIZE}", "WRITING")
            # The discarded warm-up rebalance: a 4th member joins and leaves, in the same processes.
            t_warm = time.monotonic()
            grid.join()
            grid.wait_balanced(4, time.time(), lambda: None)
            grid.leave_newest(stay=True)  # the measured joiner is this one again, warm
            warmup_s = time.monotonic() - t_warm
            time.sleep(2.0)  # the old owners free what they handed back
            idle_from = time.time()
            time.sleep(self.settings.rebalance_idle_seconds)
            idle_to = time.time()
            grid.moved_before(entries)
            t_spawn, t_joined = grid.join()
            pids = grid.member_pids()  # the joiner's too
            cpu0 = cpu_of(pids)
            cpu1 = [cpu0]

            def at_end() -> None:
                cpu1[0] = cpu_of(pids)

            t_done = grid.wait_balanced(4, t_joined, at_end)
            moved, nbytes = grid.moved_after()
            time.sleep(1.0)  # some writes after the move too
            raw = parse_list(writer.ask("STOPWRITE", "SAMPLES"), "SAMPLES")
            samples = [(float(a) / 1000, float(b), bool(c)) for a, b, c in raw]
        finally:
            if writer is not None:
                writer.close()
            grid.close()
        if moved <= 0:
            raise HarnessError(f"{system}: the join moved no entries")
        run = RebalanceRun(
            system,
            entries,
            VALUE_SIZE,
            t_joined,
            t_done,
            moved,
            nbytes,
            cpu1[0] - cpu0,
            samples,
            idle_from,
            idle_to,
            warmup_s,
        )
        shutil.rmtree(workdir, ignore_errors=True)
        figs = run.figures()
        figs["warmup_seconds"] = warmup_s
        figs["seconds_from_start"] = t_done - t_spawn
        return figs

    def ops_run(self, system: str, w: Workload) -> dict[str, float]:
        s = self.settings
        workdir = Path(tempfile.mkdtemp(prefix=f"gc-bench-gridops-{system}-"))
        grid = self._grid(system, workdir)
        clients: list[LineProc] = []
        out: dict[str, float] = {}
        try:
            grid.start(3)
            for i in range(w.senders):
                clients.append(LineProc(f"{system}-client{i}", grid.client_cmd(), workdir))
            for c in clients:
                c.expect("READY", 180.0)
            members = grid.member_pids()
            client_pids = [c.pid for c in clients]
            for measured in (False, True):
                for step in OPS_STEPS:
                    n = s.grid_single_ops if step.startswith("single") else s.grid_batch_ops
                    inflight = SINGLE_INFLIGHT if step.startswith("single") else BATCH_INFLIGHT
                    cpu0, ccpu0 = cpu_of(members), cpu_of(client_pids)
                    for i, c in enumerate(clients):
                        prefix = f"{'m' if measured else 'w'}{i}-{step[0]}-"
                        c.send(f"OPS {step} {n} {VALUE_SIZE} {inflight} {BATCH_KEYS} {prefix}")
                    done = [parse_done(c.expect("DONE", s.script_timeout)) for c in clients]
                    if not measured:
                        continue
                    figs = OpsStep(done, cpu_of(members) - cpu0, cpu_of(client_pids) - ccpu0).figures()
                    # Failed requests count in the time but not as done: reported in the note, not fatal.
                    figs["ops_per_s"] *= max(0.0, 1 - figs["errors"] / max(1.0, n * len(clients)))
                    out |= {f"{step} {k}": v for k, v in figs.items()}
        finally:
            for c in clients:
                c.close()
            grid.close()
        shutil.rmtree(workdir, ignore_errors=True)
        return out

    def _results(self, system: str, w: Workload, runs: list[dict[str, float]]) -> list[Result]:
        note = system_note(system)
        if w.run_group == "grid-rebalance":
            samples = [r[w.figure] for r in runs]
            cpu = [r["cpu_ms_per_mb"] for r in runs]
            extra = (
                f"median of {len(runs)} runs; moved {_med(runs, 'entries_moved'):,.0f} entries, "
                f"{_med(runs, 'mb_moved'):.1f} MB in {_med(runs, 'seconds'):.2f} s from the join "
                f"({_med(runs, 'seconds_from_start'):.2f} s from the joiner's launch); "
                f"warm-up join and leave {_med(runs, 'warmup_seconds'):.1f} s; "
                f"{_med(runs, 'writes_idle'):.0f} idle / {_med(runs, 'writes_during'):.0f} during writes, "
                f"{sum(r['writes_failed'] for r in runs):.0f} failed"
            )
            res = [grid_result(w.name, system, w.unit, samples, cpu, CPU_PER_MB_UNIT, f"{note}; {extra}")]
            if w.figure == "mb_per_s":
                res.append(grid_result(f"{w.name}-cpu", system, CPU_PER_MB_UNIT, cpu, cpu, CPU_PER_MB_UNIT, note))
            return res
        step = w.figure
        samples = [r[f"{step} ops_per_s"] for r in runs]
        cpu = [r[f"{step} cpu_us_per_op"] for r in runs]
        extra = (
            f"median of {len(runs)} runs; request p50 {_med(runs, step + ' p50_ms'):.2f} ms, "
            f"p99 {_med(runs, step + ' p99_ms'):.2f} ms; clients' CPU {_med(runs, step + ' client_cpu_us_per_op'):.1f} "
            f"us/op; {sum(r.get(step + ' errors', 0) for r in runs):.0f} operations failed"
        )
        return [
            grid_result(w.name, system, w.unit, samples, cpu, CPU_PER_OP_UNIT, f"{note}; {extra}"),
            grid_result(f"{w.name}-p50", system, LATENCY_UNIT, [r[f"{step} p50_ms"] for r in runs], note=note),
            grid_result(f"{w.name}-p99", system, LATENCY_UNIT, [r[f"{step} p99_ms"] for r in runs], note=note),
            grid_result(f"{w.name}-cpu", system, CPU_PER_OP_UNIT, cpu, cpu, CPU_PER_OP_UNIT, note),
        ]


def _med(runs: list[dict[str, float]], key: str) -> float:
    import statistics

    vals = [r[key] for r in runs if key in r]
    return statistics.median(vals) if vals else float("nan")


def _brief(figs: dict[str, float]) -> str:
    if "mb_per_s" in figs:
        return (
            f"{figs['mb_per_s']:.1f} MB/s, {figs['entries_per_s']:,.0f} entries/s, write p99 "
            f"{figs['idle_p99_ms']:.1f}/{figs['during_p99_ms']:.1f} ms, {figs['cpu_ms_per_mb']:.0f} ms CPU/MB"
        )
    return ", ".join(f"{s} {figs[s + ' ops_per_s']:,.0f}/s" for s in OPS_STEPS if s + " ops_per_s" in figs)
