"""A local cluster of grid member processes: start, scale, inspect and stop them, as a library.

Members are ordinary ``groupcluster member --grid --http`` processes in their own session (they outlive the
command). They find each other through a shared hosts file. The cluster's state lives in one directory
(``--dir``, default ``./.groupcluster-local``): ``cluster.json`` (name, members with pid, ports and log),
``hosts`` (the hosts file), ``mN.log`` and ``mN.status.json`` per member.

**Scaling down** asks members to leave through ``POST /v1/leave``, at most ``num_owners - 1`` at a time,
and waits until each has handed its segments off and exited before the next wave. With the grid's rule
that an acknowledged write is on every owner, no wave can take away every copy of a segment. Members leave
newest first; the coordinator leaves last, because a new coordinator has to recover the topology first.

**Capacity** (:meth:`LocalCluster.set_capacity`) sets a running member's capacity factor through
``POST /v1/capacity`` and waits until the grid is balanced for it: at 0 the member keeps serving requests but
owns no segments, at 2 it takes about twice the share of a member at 1. The change lasts as long as the member
process.

The command ``groupcluster local`` (:mod:`groupcluster.tools.local`) is this module on a terminal; the grid
demo, ``groupcluster chaos`` and the benchmarks use :class:`LocalCluster` directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_DIR = ".groupcluster-local"
STATE_FILE = "cluster.json"
HOSTS_FILE = "hosts"
LOCK_FILE = "lock"
HOST = "127.0.0.1"
MAX_MEMBERS = 16
DEFAULT_OWNERS = 2
# A member asked to stop hands its segments off first; on a busy 2-core machine that can take minutes for
# big grids, and a member that gave up would take data with it.
LEAVE_TIMEOUT = 600.0
STATUS_TIMEOUT = 2.0
# After a capacity change the grid keeps its topology when it is balanced for the new capacities already (2
# members with 2 owners each own every segment, whatever their capacities). A member sends its new capacity to
# the coordinator at once, which plans in the same step, so a grid that stays settled this long will not move.
UNCHANGED_WAIT = 3.0


class LocalError(Exception):
    """A clear, user-facing failure of a ``groupcluster local`` command."""


@dataclass
class MemberRecord:
    """One member process as recorded in ``cluster.json``."""

    name: str
    number: int
    pid: int
    bind: str
    http: str
    log: str
    started: float


# ==== rebalance progress ========================================================================================
def rebalance_progress(statuses: Iterable[dict[str, Any] | None]) -> tuple[float | None, str]:
    """Grid-wide transfer progress from members' ``/v1/status``: (fraction or None, a short description)."""
    phases: set[str] = set()
    topologies: set[int] = set()
    to_fetch = fetched = 0
    for st in statuses:
        g = (st or {}).get("grid") or {}
        if g.get("phase"):
            phases.add(g["phase"])
        if g.get("topology_id") is not None:
            topologies.add(g["topology_id"])
        reb = g.get("rebalance") or {}
        to_fetch += int(reb.get("segments_to_fetch") or 0)
        fetched += int(reb.get("segments_fetched") or 0)
    topo = f"topology {max(topologies)}" if topologies else "no topology yet"
    if "READ_OLD_WRITE_ALL" in phases and to_fetch:
        return fetched / to_fetch, f"moving segments {fetched}/{to_fetch} ({topo})"
    moving = phases - {"NO_REBALANCE"}
    if moving:
        return 1.0, f"segments moved, finishing {'/'.join(sorted(moving))} ({topo})"
    return None, f"no rebalance running ({topo})"


# ==== helpers ===================================================================================================
def free_port(kind: int, host: str = HOST, avoid: Iterable[int] = ()) -> int:
    """A port the system reports free for ``kind`` (SOCK_DGRAM or SOCK_STREAM) on ``host``."""
    avoid = set(avoid)
    for _ in range(50):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
        if port not in avoid:
            return port
    raise LocalError(f"no free port found on {host}")


def free_ports(n: int, host: str = HOST, avoid: Iterable[int] = ()) -> list[int]:
    """``n`` distinct ports free for both TCP and UDP on ``host`` (a member's transport may be either)."""
    ports: list[int] = []
    avoid = set(avoid)
    for _ in range(50 * n):
        if len(ports) == n:
            break
        port = free_port(socket.SOCK_STREAM, host, avoid=avoid | set(ports))
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((host, port))
        except OSError:
            continue
        ports.append(port)
    if len(ports) < n:
        raise LocalError(f"no {n} ports free for TCP and UDP on {host}")
    return ports


def get_json(url: str, timeout: float = STATUS_TIMEOUT) -> dict[str, Any] | None:
    """The JSON body of a GET (whatever the status), or None when the member cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return json.loads(exc.read())
        except ValueError:
            return None
    except (OSError, ValueError):
        return None


def post(url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> tuple[int, dict[str, Any] | None]:
    """POST ``body`` as JSON (or nothing); returns the status and the JSON answer (None if it is not JSON)."""
    data = b"" if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            return exc.code, None


def pid_alive(pid: int, needle: str = "") -> bool:
    """True if ``pid`` runs and is not a zombie; with ``needle``, its command line must contain it (pid reuse)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return not needle
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return True  # no procfs: trust the signal check
    try:
        stat = (proc / "stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
        if needle:
            return needle.encode() in (proc / "cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return True


def remove_host(path: Path, endpoint: str) -> None:
    """Drop ``endpoint`` from the shared hosts file (under the same lock the members take to add themselves)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return
    with os.fdopen(fd, "r+", encoding="utf-8") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            lines = [ln for ln in fh.read().splitlines() if ln.strip() != endpoint]
            fh.seek(0)
            fh.truncate()
            fh.write("".join(f"{ln}\n" for ln in lines))
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def check_count(n: int, what: str = "N") -> int:
    if not 1 <= n <= MAX_MEMBERS:
        raise LocalError(f"{what}: expected 1 to {MAX_MEMBERS} members, got {n}")
    return n


class _Report(list[str]):
    """The lines of what a command did, passed on to a callback as they are added."""

    def __init__(self, report: Callable[[str], None] | None) -> None:
        super().__init__()
        self.report = report

    def append(self, line: str) -> None:
        super().append(line)
        if self.report is not None:
            self.report(line)


# ==== the cluster ===============================================================================================
ProgressFn = Callable[[float | None, str], None]


class LocalCluster:
    """The member processes recorded in one directory, and the operations on them."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory).resolve()
        self.cluster = ""
        self.num_owners = DEFAULT_OWNERS
        self.grid_params: list[str] = []
        self.next_number = 1
        self.members: list[MemberRecord] = []
        self._popen: dict[str, subprocess.Popen[bytes]] = {}  # the members this process started
        # Members started by this object record their history (``--record``) to ``mN.history.jsonl``
        # (``groupcluster chaos`` feeds their views to the checkers); not kept in cluster.json.
        self.record = False
        # ... and take faults-layer settings from ``mN.faults.json`` (``--faults-control``: how chaos cuts one
        # off the network).
        self.faults_control = False
        # Extra arguments for every member this object starts, after the ones above (benchmarks compare
        # transports and stack settings this way, e.g. ``--transport tcp --set frag.frag_size=1MiB``); not kept
        # in cluster.json either, so a later ``groupcluster local scale`` starts members without them.
        self.member_args: list[str] = []

    # -- state -----------------------------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.dir / STATE_FILE

    @property
    def hosts_path(self) -> Path:
        return self.dir / HOSTS_FILE

    def load(self) -> bool:
        """Read ``cluster.json``; False if there is none."""
        try:
            doc = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as exc:
            raise LocalError(f"{self.state_path}: unreadable cluster state ({exc}); remove the directory") from None
        try:
            self.cluster = doc["cluster"]
            self.num_owners = int(doc.get("num_owners", DEFAULT_OWNERS))
            self.grid_params = list(doc.get("grid_params", []))
            self.next_number = int(doc["next_number"])
            self.members = [MemberRecord(**m) for m in doc["members"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise LocalError(f"{self.state_path}: bad cluster state ({exc}); remove the directory") from None
        return True

    def save(self) -> None:
        doc = {
            "cluster": self.cluster,
            "num_owners": self.num_owners,
            "grid_params": self.grid_params,
            "next_number": self.next_number,
            "members": [asdict(m) for m in self.members],
        }
        tmp = self.state_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, self.state_path)

    @contextlib.contextmanager
    def locked(self) -> Any:
        """Serialize commands on one directory (two ``scale`` at once would pick the same free ports)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / LOCK_FILE, "w") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LocalError(f"another groupcluster local command is working on {self.dir}") from None
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def alive(self, m: MemberRecord) -> bool:
        p = self._popen.get(m.name)
        if p is not None:
            return p.poll() is None
        return pid_alive(m.pid, m.bind)

    def live(self) -> list[MemberRecord]:
        return [m for m in self.members if self.alive(m)]

    def require_running(self) -> None:
        if not self.load():
            raise LocalError(f"no cluster in {self.dir} (start one with: groupcluster local start --members N)")
        if not self.live():
            raise LocalError(
                f"no member of the cluster in {self.dir} is running (start one with: groupcluster local start)"
            )

    def prune(self) -> list[MemberRecord]:
        """Forget members whose process is gone (crashed, killed, or left); returns them."""
        gone = [m for m in self.members if not self.alive(m)]
        for m in gone:
            remove_host(self.hosts_path, m.bind)
            self._popen.pop(m.name, None)
        self.members = [m for m in self.members if m not in gone]
        return gone

    # -- processes -------------------------------------------------------------------------------------------
    def _spawn(self) -> MemberRecord:
        number = self.next_number
        self.next_number += 1
        name = f"m{number}"
        taken = {int(m.bind.rsplit(":", 1)[1]) for m in self.members}
        # Free for TCP too: ``member_args`` may put the member on the TCP transport, which binds the same port
        # number for TCP (a port free only for UDP was once taken by another test's TCP socket).
        (port,) = free_ports(1, avoid=taken)
        http_port = free_port(socket.SOCK_STREAM, avoid=taken | {port})
        log = self.dir / f"{name}.log"
        argv = [
            sys.executable,
            "-m",
            "groupcluster.cli",
            "member",
            "--cluster",
            self.cluster,
            "--bind",
            f"{HOST}:{port}",
            "--hosts-file",
            str(self.hosts_path),
            "--grid",
            "--http",
            f"{HOST}:{http_port}",
            "--grid-leave-timeout",
            str(LEAVE_TIMEOUT),
            "--status-file",
            str(self.dir / f"{name}.status.json"),
        ]
        for p in self.grid_params:
            argv += ["--grid-set", p]
        if self.record:
            argv += ["--record", str(self.history_path(name))]
        if self.faults_control:
            argv += ["--faults-control", str(self.faults_control_path(name))]
        argv += self.member_args
        with open(log, "wb") as out:
            # A session of its own: the member outlives this command and a Ctrl-C in its terminal.
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self._popen[name] = proc
        rec = MemberRecord(
            name, number, proc.pid, f"{HOST}:{port}", f"http://{HOST}:{http_port}", str(log), time.time()
        )
        self.members.append(rec)
        return rec

    def spawn(self) -> MemberRecord:
        """Start one more member (it joins the running cluster) and record it in ``cluster.json``."""
        rec = self._spawn()
        self.save()
        return rec

    def spawn_and_wait_joined(self, timeout: float = 600.0) -> tuple[MemberRecord, float, float]:
        """:meth:`spawn`, then wait until the member reports it joined the group; returns it with the wall-clock
        times (``time.time()``) of its start and of the first status saying joined (what the benchmarks time a
        rebalance from). Raises :class:`LocalError` if it has not joined within ``timeout`` seconds."""
        started = time.time()
        rec = self.spawn()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive(rec):
                raise LocalError(f"{rec.name} ({rec.http}) exited before it joined:\n{self.log_tail(rec)}")
            st = get_json(rec.http + "/v1/status", timeout=1.0)
            if st and st.get("joined"):
                return rec, started, time.time()
            time.sleep(0.02)
        raise LocalError(f"{rec.name} did not join within {timeout:.0f}s (log: {rec.log})")

    def history_path(self, name: str) -> Path:
        """Where member ``name`` records its history when :attr:`record` is set."""
        return self.dir / f"{name}.history.jsonl"

    def faults_control_path(self, name: str) -> Path:
        """Member ``name``'s faults control file when :attr:`faults_control` is set."""
        return self.dir / f"{name}.faults.json"

    def popen(self, name: str) -> subprocess.Popen[bytes] | None:
        """The process of member ``name`` if this object started it."""
        return self._popen.get(name)

    def log_tail(self, m: MemberRecord, lines: int = 8) -> str:
        try:
            return "\n".join(Path(m.log).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- queries ---------------------------------------------------------------------------------------------
    def statuses(self, members: Iterable[MemberRecord] | None = None) -> dict[str, dict[str, Any] | None]:
        return {m.name: get_json(m.http + "/v1/status") for m in (self.members if members is None else members)}

    def settled(self, statuses: dict[str, dict[str, Any] | None]) -> bool:
        """Every member answers, sees exactly these members, is ready, and all agree on a balanced topology."""
        tops = set()
        for st in statuses.values():
            if not st or not st.get("joined") or not st.get("grid") or not st.get("view"):
                return False
            g = st["grid"]
            if len(st["view"]["members"]) != len(statuses) or not g.get("ready"):
                return False
            if g["phase"] != "NO_REBALANCE" or g["availability"] != "AVAILABLE":
                return False
            tops.add(g["topology_id"])
        return len(tops) == 1

    def wait_settled(self, what: str, timeout: float, progress: ProgressFn | None) -> float:
        """Wait until the live members are settled; report progress about 4 times a second."""
        start = time.monotonic()
        while True:
            members = list(self.members)
            for m in members:
                if not self.alive(m):
                    raise LocalError(f"{m.name} ({m.http}) exited while waiting for {what}:\n{self.log_tail(m)}")
            st = self.statuses(members)
            if self.settled(st):
                if progress is not None:
                    # A last full bar: on a fast machine the rebalance may finish between two polls.
                    tops = {s["grid"]["topology_id"] for s in st.values() if s and s.get("grid")}
                    progress(1.0, f"rebalance done (topology {max(tops, default=0)})")
                return time.monotonic() - start
            if progress is not None:
                joined = sum(1 for s in st.values() if s and s.get("joined"))
                views = [len(s["view"]["members"]) for s in st.values() if s and s.get("view")]
                if joined < len(members) or min(views, default=0) < len(members):
                    progress(None, f"waiting for {len(members)} members to join ({joined} joined)")
                else:
                    progress(*rebalance_progress(st.values()))
            if time.monotonic() - start > timeout:
                raise LocalError(f"gave up after {timeout:g}s waiting for {what}: {self.describe(st)}")
            time.sleep(0.25)

    @staticmethod
    def describe(st: dict[str, dict[str, Any] | None]) -> str:
        parts = []
        for name, s in st.items():
            g = (s or {}).get("grid") or {}
            parts.append(f"{name}: {'no answer' if not s else g.get('phase', 'not joined')}")
        return ", ".join(parts)

    def coordinator(self, st: dict[str, dict[str, Any] | None]) -> str | None:
        by_addr = {s["address"]: name for name, s in st.items() if s and s.get("address")}
        for s in st.values():
            if s and s.get("coordinator"):
                return by_addr.get(s["coordinator"])
        return None

    # -- commands --------------------------------------------------------------------------------------------
    def start(
        self,
        n: int,
        *,
        cluster: str | None = None,
        grid_params: Iterable[str] = (),
        timeout: float = 120.0,
        progress: ProgressFn | None = None,
    ) -> float:
        """Start ``n`` members and wait until they form one balanced grid; returns the seconds it took."""
        check_count(n, "--members")
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.load() and self.live():
            raise LocalError(
                f"a cluster is already running in {self.dir} ({len(self.live())} members): "
                "stop it first (groupcluster local stop) or use another --dir"
            )
        params = list(grid_params)
        for p in params:
            key, sep, value = p.partition("=")
            if not sep or not key:
                raise LocalError(f"--grid-set: expected KEY=VALUE, got {p!r}")
            if key == "num_owners":
                try:
                    self.num_owners = int(value)
                except ValueError:
                    raise LocalError(f"--grid-set num_owners: expected an integer, got {value!r}") from None
        self.cluster = cluster or f"local-{os.getpid()}"
        self.grid_params = params
        self.next_number = 1
        self.members = []
        self.hosts_path.write_text("")
        for _ in range(n):
            self._spawn()
        self.save()
        return self.wait_settled(f"{n} members to form a grid", timeout, progress)

    def scale(
        self,
        n: int,
        *,
        timeout: float = 600.0,
        progress: ProgressFn | None = None,
        report: Callable[[str], None] | None = None,
    ) -> list[str]:
        """Grow or shrink to ``n`` members (see the module docstring); returns what happened, line by line.

        ``report`` gets each line as it happens (a member left, the rebalance ended).
        """
        check_count(n)
        done = _Report(report)
        for m in self.prune():
            done.append(f"{m.name} was no longer running; forgotten")
        current = len(self.members)
        if n > current:
            added = [self._spawn() for _ in range(n - current)]
            self.save()
            took = self.wait_settled(f"{n} members to rebalance", timeout, progress)
            done.append(f"started {', '.join(m.name for m in added)}; rebalanced in {took:.1f}s")
        elif n < current:
            self._shrink(current - n, timeout, progress, done)
        else:
            self.save()
            done.append(f"already {n} members")
        return done

    def _shrink(self, count: int, timeout: float, progress: ProgressFn | None, done: _Report) -> None:
        per_wave = max(1, self.num_owners - 1)
        deadline = time.monotonic() + timeout
        left = 0
        while left < count:
            st = self.statuses()
            coord = self.coordinator(st)
            # Newest first; the coordinator last (its successor must recover the topology before going on).
            order = sorted(self.members, key=lambda m: (m.name == coord, -m.number))
            wave = order[: min(per_wave, count - left)]
            t0 = time.monotonic()
            for m in wave:
                code, body = post(m.http + "/v1/leave")
                if code != 202:
                    raise LocalError(f"{m.name} refused to leave: HTTP {code} {body}")
            self._wait_exit(wave, deadline, progress)
            for m in wave:
                remove_host(self.hosts_path, m.bind)
                p = self._popen.pop(m.name, None)
                code_text = "" if p is None else f" (exit status {p.returncode})"
                done.append(f"{m.name} handed its segments off and left in {time.monotonic() - t0:.1f}s{code_text}")
            self.members = [m for m in self.members if m not in wave]
            self.save()
            left += len(wave)
        took = self.wait_settled(
            f"{len(self.members)} members to settle", max(1.0, deadline - time.monotonic()), progress
        )
        done.append(f"{len(self.members)} members balanced {took:.1f}s after the last leave")

    def _wait_exit(self, wave: list[MemberRecord], deadline: float, progress: ProgressFn | None) -> None:
        names = ", ".join(m.name for m in wave)
        while any(self.alive(m) for m in wave):
            if time.monotonic() > deadline:
                raise LocalError(
                    f"{names} did not finish handing off within the timeout: {self.describe(self.statuses())}"
                )
            if progress is not None:
                stay = [m for m in self.members if m not in wave]
                fraction, text = rebalance_progress(self.statuses(stay).values())
                progress(fraction, f"{names} leaving: {text}")
            time.sleep(0.25)

    def member(self, name: str) -> MemberRecord:
        """The running member called ``name``; a LocalError names the members there are otherwise."""
        m = next((m for m in self.members if m.name == name), None)
        if m is None:
            names = ", ".join(m.name for m in self.members) or "none"
            raise LocalError(f"no member {name!r} in the cluster (members: {names})")
        if not self.alive(m):
            raise LocalError(f"{name} ({m.http}) is not running:\n{self.log_tail(m)}")
        return m

    def topology_id(self) -> int:
        """The newest topology id any member reports (-1 if none has one)."""
        tops = [((s or {}).get("grid") or {}).get("topology_id") for s in self.statuses().values()]
        return max((t for t in tops if t is not None), default=-1)

    def set_capacity(
        self, name: str, capacity: float, *, timeout: float = 600.0, progress: ProgressFn | None = None
    ) -> tuple[float, float | None, bool]:
        """Set member ``name``'s capacity (``POST /v1/capacity``) and wait until the grid is balanced for it.

        Returns (seconds it took, the member's capacity before, whether segments moved). A grid already
        balanced for the new capacity keeps its owners; that is known once it stayed settled for
        ``UNCHANGED_WAIT`` seconds. A new topology alone says nothing (a view change unrelated to the capacity
        makes one too): segments moved when some member owns another number of them.
        """
        m = self.member(name)
        before = get_json(m.http + "/v1/status")
        old = ((before or {}).get("grid") or {}).get("capacity")
        top = self.topology_id()
        owned = self.segments_owned()
        start = time.monotonic()
        code, body = post(m.http + "/v1/capacity", {"capacity": capacity})
        if code != 202:
            why = (body or {}).get("error") or body
            raise LocalError(f"{name} refused capacity {capacity:g}: HTTP {code}: {why}")
        deadline = start + timeout
        while True:
            self.wait_settled(
                f"the grid to rebalance for {name}'s capacity", max(0.1, deadline - time.monotonic()), progress
            )
            if self.topology_id() > top and self.segments_owned() != owned:
                return time.monotonic() - start, old, True
            if time.monotonic() - start >= UNCHANGED_WAIT:
                return time.monotonic() - start, old, False
            time.sleep(0.25)

    def stop(self, grace: float = 10.0) -> tuple[int, int]:
        """Stop every member, SIGKILL what is left after ``grace`` seconds; returns (stopped, killed).

        The data goes with the cluster: members stopping at the same time have nowhere to hand it to, so each
        gets SIGTERM twice (the second skips the grid hand-off) and leaves the group at once.
        """
        live = self.live()
        for sig_round in range(2):
            for m in live:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(m.pid, signal.SIGTERM)
            if sig_round == 0:
                time.sleep(0.3)  # let the first signal register as "stop" before the second says "hurry"
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(self.alive(m) for m in live):
            time.sleep(0.1)
        killed = 0
        for m in live:
            if self.alive(m):
                killed += 1
                with contextlib.suppress(ProcessLookupError):
                    os.kill(m.pid, signal.SIGKILL)
        for p in self._popen.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        self._popen.clear()
        self.members = []
        if self.state_path.exists():
            self.save()
        return len(live) - killed, killed

    def kill_all(self) -> None:
        """SIGKILL every member this process started (clean-up after a failure)."""
        for p in self._popen.values():
            if p.poll() is None:
                p.kill()
        for p in self._popen.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)

    # -- status ----------------------------------------------------------------------------------------------
    def segments_owned(self) -> dict[str, int | None]:
        """How many segments each member owns, by name (None: no answer or no topology)."""
        return {n: ((s or {}).get("grid") or {}).get("segments_owned") for n, s in self.statuses().items()}

    def status_rows(self) -> list[dict[str, Any]]:
        st = self.statuses()
        by_addr = {s["address"]: name for name, s in st.items() if s and s.get("address")}
        rows = []
        for m in self.members:
            s = st.get(m.name)
            g = (s or {}).get("grid") or {}
            view = (s or {}).get("view")
            rows.append(
                {
                    "member": m.name,
                    "pid": m.pid,
                    "alive": self.alive(m),
                    "endpoint": m.http,
                    "address": (s or {}).get("address"),
                    "coordinator": bool(s and s.get("coordinator") == s.get("address")),
                    "view_id": view["id"] if view else None,
                    "view": [by_addr.get(a, a) for a in view["members"]] if view else None,
                    "topology_id": g.get("topology_id"),
                    "phase": g.get("phase"),
                    "availability": g.get("availability"),
                    "segments_primary": g.get("segments_primary"),
                    "segments_owned": g.get("segments_owned"),
                    "capacity": g.get("capacity"),
                    "keys": ((g.get("store") or {}).get("entries")),
                    "ready": g.get("ready"),
                    "leaving": g.get("leaving"),
                }
            )
        return rows
