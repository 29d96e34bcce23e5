"""``groupcluster chaos``: real member processes under seeded faults, judged by the simulator's grid checkers.

::

    groupcluster chaos --minutes 5 --seed 7            # 4 members, faults every few seconds for 5 minutes
    groupcluster chaos --minutes 1 --seed 1 --json     # the report as one JSON line before the last line
    groupcluster chaos --minutes 5 --seed 7 --capacity-changes   # capacity changes are faults too

1. Starts a local cluster (:class:`~groupcluster.tools.local_cluster.LocalCluster`) of ``--members`` grid members
   on loopback; each records its history (``--record``), so its views reach the checkers.
2. Runs a writer and a reader, each a thread with its own :class:`~groupcluster.grid.client.GridClient`,
   over a small pool of keys (puts of unique values, some deletes; gets). Every operation is recorded as a
   ``grid_start`` event before the request and a ``grid_end`` event after the answer: the events of the
   simulator's grid histories (:mod:`groupcluster.sim.grid.checkers`), so one code judges both.
3. Every few seconds it injects a fault drawn from a :class:`random.Random` seeded with ``--seed``:

   * ``kill``: SIGKILL a member and start a replacement;
   * ``pause``: SIGSTOP a member for 1 to 10 seconds, then SIGCONT it (a long pause gets it excluded; it comes
     back through a merge);
   * ``leave``: ask a member to leave gracefully (``POST /v1/leave``) and start a replacement;
   * ``cut``: cut a member off the network for 2 to 12 seconds, then heal. Every member runs with
     ``--faults-control`` (a ``faults`` layer above its transport, steered by its file ``mN.faults.json``,
     :mod:`groupcluster.runtime.faults_control`); the run writes the partition {victim} | {everybody else}
     into every live member's file, waits until each reports it applied it, and after the cut writes the
     heal the same way. Both sides drop the other side's frames, so the victim keeps running and answering
     its clients on its own: before anyone notices it serves what its side can (a read of its own copy, a
     write that then waits for the other owner), once excluded it is a one-member group whose degraded
     topology refuses what it cannot serve safely (503 in the default ``deny_read_writes`` mode). A long cut
     (past the failure detector's 4 s + 1 s) gets it excluded, and after the heal it comes back through a
     merge; a short one is ridden out. The report gives, per cut, the frames each side's faults layer
     dropped: that the cut really cut.
   * ``capacity`` (only with ``--capacity-changes``): set a member's capacity to 0, 0.5, 1 or 2 through
     ``POST /v1/capacity`` (the value from a random stream of its own, seeded by the seed). The coordinator
     rebalances to it: at 0 the member hands every segment to the others and stays a member. A 0 that would
     leave fewer than ``num_owners`` members with capacity is made 1, so every segment keeps ``num_owners``
     copies. Replacements start at capacity 1.

   The kind, the victim (by name: ``m1``, ``m2``, ...; replacements take the next number) and the delays come
   from the seed alone, so a seed replays its fault schedule (the timing of the operations around it is the
   machine's). The first four faults are the four kinds in a seeded order (five with ``--capacity-changes``),
   so every run of that many faults or more has each kind; without the option a seed draws what it drew
   before the option existed. At most ``num_owners - 1`` members are faulted at a time (down, paused, or cut off):
   a fault counts until the grid is balanced again after it, and before a fault that would exceed the
   limit the run waits until it is (every member ready on one topology, no rebalance running). Operations
   are only acknowledged when the member answered OK, whatever side of a cut it was on: the checkers judge
   them all, with no allowance for the cut beyond what the members' own views show (the ``cut`` events in
   the history are for readers; no checker reads them).
4. At the end: faults stop, the grid converges, the workload stops, every key ever written is read back
   (``grid_converged`` then final reads), every owner's copy of every segment is scanned (``grid_store``),
   and the checkers run: ``grid-fresh-reads``, ``grid-lost-write`` and ``grid-replicas-equal``.

The output is a table of the faults and the figures, ending in exactly ``chaos: <ops> ops, <V> violations,
<L> lost``: ``ops`` operations of the workload and the read-back, ``V`` checker violations of every kind
(lost writes included), ``L`` keys lost (a final read-back that did not return an allowed value, or that
failed). The exit status is 0 only if V and L are 0. The merged history is kept as ``chaos-history.jsonl``
in ``--dir`` (a temporary directory is removed after a clean run, kept after a failing one), so
``groupcluster check --stack grid FILE`` judges it again.

One module, in the order of the steps above (recording, workload, the run with its fault schedule, the
judgement, the report, the command): each step is short, they share the run's constants and
:class:`ChaosResult`, and a reader follows one run from top to bottom. The processes themselves are
:mod:`groupcluster.tools.local_cluster`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from ..runtime.faults_control import HEAL_DOCUMENT, partition_document, write_control
from .local_cluster import DEFAULT_OWNERS, MAX_MEMBERS, LocalCluster, LocalError, MemberRecord, get_json, post

KINDS = ("kill", "pause", "leave", "cut")
CAPACITY = "capacity"  # the fault kind --capacity-changes adds
# The capacities a capacity fault sets (drawn from their own seeded stream: see FaultSchedule.capacity).
CAPACITY_VALUES = (0.0, 0.5, 1.0, 2.0)
# A client request gives up after REQUEST_TIMEOUT; a member's operation ends within OP_TIMEOUT + ATTEMPT_TIMEOUT
# (see Chaos.grid_params), which must stay below it.
REQUEST_TIMEOUT = 5.0
OP_TIMEOUT = 3.0
ATTEMPT_TIMEOUT = 1.0
KEY_POOL = 64  # few keys: reads and writes of one key overlap often, which is what the checkers judge
DELETE_SHARE = 0.1
OP_PAUSE = 0.01  # between a thread's operations: the members share a small machine with the workload
FAULT_GAP = (2.0, 5.0)  # seconds between faults (seeded)
# Seconds a paused member stays stopped (seeded): past the failure detector's 4 s (+ verification) a paused
# member is suspected and excluded, and on SIGCONT it comes back through a merge; shorter pauses are
# ridden out. Both happen.
PAUSE_LENGTH = (1.0, 10.0)
# Seconds a cut-off member stays cut off (seeded): like a pause, a long cut gets it excluded (and it comes back
# through a merge), a short one is ridden out; unlike a pause, the member keeps running and serving its
# clients on its own side meanwhile.
CUT_LENGTH = (2.0, 12.0)
# The partition a cut writes ends on its own this long after the cut should have been healed, so members
# heal even if this process dies in between.
CUT_SAFETY = 60.0
# How long every member may take to apply a control file (it polls every 0.2 s; its status file, which says
# that it did, is rewritten every 0.5 s).
CONTROL_TIMEOUT = 10.0
START_TIMEOUT = 180.0
SETTLE_TIMEOUT = 180.0
# Kinds of the members' own history events the checkers use (views: divergence windows and grid lineages).
MEMBER_KINDS = frozenset({"view", "grid_topology", "grid_split", "grid_merge", "leave", "left", "crash"})
HISTORY_FILE = "chaos-history.jsonl"


class ChaosError(Exception):
    """A clear, user-facing failure of ``groupcluster chaos`` (bad argument, cluster that never settles)."""


@dataclass
class FaultRecord:
    """One injected fault, as shown in the report."""

    number: int
    at: float  # seconds since the workload started
    kind: str
    member: str
    detail: str
    replacement: str | None = None
    length: float | None = None  # seconds a pause or a cut lasted
    recovered_after: float | None = None  # seconds from the fault until the grid was balanced again
    # A cut: frames to or from the other side that the victim's faults layer dropped, and the others' layers
    # together (their counters over the cut, read just before the heal): that the cut really cut.
    dropped: list[int] | None = None
    started: float = field(default=0.0, repr=False)  # time.monotonic() of the fault


# ==== history recording =========================================================================================
class HistoryLog:
    """The client side of the history: thread-safe, in wall-clock seconds like the members' recorders."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.counter = 0

    def add(self, member: str, kind: str, **data: Any) -> None:
        with self.lock:
            self.events.append({"t": time.time(), "member": member, "kind": kind, **data})

    def next_id(self, who: str) -> str:
        with self.lock:
            self.counter += 1
            return f"{who}-{self.counter}"


def _text(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", errors="backslashreplace")


def timed_op(log: HistoryLog, who: str, op: str, key: bytes, value: bytes | None, call: Callable[[], Any]) -> bool:
    """Run one grid operation between a ``grid_start`` and a ``grid_end`` event; True if acknowledged."""
    from ..grid.client import GridClientError

    op_id = log.next_id(who)
    log.add(who, "grid_start", id=op_id, op=op, key=_text(key), value=_text(value) if op == "put" else None)
    try:
        result = call()
    except (GridClientError, OSError, ValueError) as exc:
        log.add(who, "grid_end", id=op_id, ok=False, error=str(exc)[:300])
        return False
    log.add(who, "grid_end", id=op_id, ok=True, value=_text(result) if op == "get" else None)
    return True


# ==== workload ==================================================================================================
@dataclass
class Workload:
    """A writer and a reader thread over :data:`KEY_POOL` keys, recording every operation."""

    endpoints: Callable[[], list[str]]
    log: HistoryLog
    seed: int
    stop: threading.Event = field(default_factory=threading.Event)
    written: set[bytes] = field(default_factory=set)
    counts: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for role in ("writer", "reader"):
            t = threading.Thread(target=self._run, args=(role,), name=f"chaos-{role}", daemon=True)
            t.start()
            self.threads.append(t)

    def finish(self, timeout: float = 120.0) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout)
            if t.is_alive():
                raise ChaosError(f"{t.name} did not finish its last operation within {timeout:g}s")

    def _client(self) -> Any:
        from ..grid.client import GridClient

        # Short request timeouts: a paused member must not hold an operation for the default 35 s; the
        # client then retries on another member within ``timeout``.
        return GridClient(
            self.endpoints(), request_timeout=REQUEST_TIMEOUT, timeout=30.0, retries=30, avoid_seconds=3.0
        )

    def _run(self, role: str) -> None:
        rng = random.Random(f"{self.seed}:{role}")
        seq = 0
        client = self._client()
        try:
            while not self.stop.is_set():
                key = f"k{rng.randrange(KEY_POOL):03d}".encode()
                if role == "reader":
                    op, ok = "get", timed_op(self.log, role, "get", key, None, functools.partial(client.get, key))
                elif rng.random() < DELETE_SHARE:
                    op, ok = (
                        "delete",
                        timed_op(self.log, role, "delete", key, None, functools.partial(client.delete, key)),
                    )
                else:
                    seq += 1
                    value = f"v{seq}".encode()
                    with self.log.lock:
                        self.written.add(key)  # before the request: an unacknowledged put may have landed
                    op, ok = (
                        "put",
                        timed_op(self.log, role, "put", key, value, functools.partial(client.put, key, value)),
                    )
                with self.log.lock:
                    self.counts[f"{op} {'ok' if ok else 'failed'}"] += 1
                if not ok:
                    # A fresh client learns the replacements' endpoints (a client only knows the endpoints
                    # it was given and those in the routing tables it read).
                    client.close()
                    client = self._client()
                time.sleep(OP_PAUSE)
        except Exception as exc:  # a bug of ours: report it instead of dying silently in a thread
            self.errors.append(f"{role}: {type(exc).__name__}: {exc}")
        finally:
            client.close()


# ==== the run ===================================================================================================
@dataclass
class ChaosResult:
    seed: int
    minutes: float
    members: int
    num_owners: int
    faults: list[FaultRecord]
    ops: int
    op_counts: dict[str, int]
    keys_checked: int
    violations: dict[str, int]
    samples: list[str]
    lost: int
    lost_keys: list[str]
    duration: float
    history: str
    errors: list[str]
    # Settles after which every member at capacity 0 was checked to own no segment (--capacity-changes).
    capacity_checks: int = 0

    @property
    def total_violations(self) -> int:
        return sum(self.violations.values())

    @property
    def ok(self) -> bool:
        return self.total_violations == 0 and self.lost == 0 and not self.errors

    def summary(self) -> str:
        return f"chaos: {self.ops} ops, {self.total_violations} violations, {self.lost} lost"

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for f in doc["faults"]:
            del f["started"]
        doc["fault_kinds"] = dict(Counter(f.kind for f in self.faults))
        doc["total_violations"] = self.total_violations
        doc["ok"] = self.ok
        return doc


class FaultDraw(NamedTuple):
    kind: str
    victim: str
    hold: float  # seconds a pause or a cut lasts (drawn for every kind, used by these two)


class FaultSchedule:
    """The seeded draws of a run: gaps, kinds, victims and pause/cut lengths, in the order the run asks for them.

    Victims are drawn by name from the members present (``m1``, ``m2``, ... with replacements taking the next
    number), which the schedule itself determines, so a seed replays the same faults on the same names.
    """

    def __init__(self, seed: int, *, capacity_changes: bool = False) -> None:
        self.rng = random.Random(seed)
        self.kinds = (*KINDS, CAPACITY) if capacity_changes else KINDS
        # Capacity values come from a stream of their own, so the faults' stream draws the same with or without
        # them (kinds aside) and a capacity fault's value does not shift later victims and lengths.
        self._capacity_rng = random.Random(f"capacity-{seed}")
        self._first: list[str] = []

    def gap(self) -> float:
        return self.rng.uniform(*FAULT_GAP)

    def draw(self, number: int, names: list[str]) -> FaultDraw:
        """Fault ``number`` (from 1). The first ``len(self.kinds)`` faults are each kind once, in a seeded order."""
        kinds = self.kinds
        if number == 1:
            self._first = self.rng.sample(kinds, len(kinds))
        kind = self._first[number - 1] if number <= len(kinds) else self.rng.choice(kinds)
        victim = self.rng.choice(sorted(names, key=lambda n: (len(n), n)))
        # Both lengths are drawn for every kind: later draws do not depend on which kinds came before.
        pause_for = self.rng.uniform(*PAUSE_LENGTH)
        cut_for = self.rng.uniform(*CUT_LENGTH)
        return FaultDraw(kind, victim, cut_for if kind == "cut" else pause_for)

    def capacity(self) -> float:
        """The capacity a capacity fault sets (one of :data:`CAPACITY_VALUES`)."""
        return self._capacity_rng.choice(CAPACITY_VALUES)


class Chaos:
    """One chaos run on a fresh local cluster in ``directory``."""

    def __init__(
        self,
        directory: Path,
        *,
        minutes: float,
        seed: int,
        members: int,
        num_owners: int = DEFAULT_OWNERS,
        capacity_changes: bool = False,
        say: Callable[[str], None] = print,
    ) -> None:
        self.dir = directory
        self.minutes = minutes
        self.seed = seed
        self.members = members
        self.num_owners = num_owners
        self.say = say
        self.schedule = FaultSchedule(seed, capacity_changes=capacity_changes)
        self.capacities: dict[str, float] = {}  # member name -> capacity set by a fault (absent: 1, as started)
        self.capacity_checks = 0
        self.cluster = LocalCluster(directory)
        self.cluster.record = True
        self.cluster.faults_control = True  # a faults layer in every member, steered by its control file
        self.applied: dict[str, int] = {}  # member name -> control files written to it so far
        self.log = HistoryLog()
        self.faults: list[FaultRecord] = []
        self.down = 0  # faults since the grid was last balanced
        self.addresses: dict[str, str] = {}  # member name -> group address (for crash/leave events)

    # -- faults ----------------------------------------------------------------------------------------------
    def _learn_addresses(self) -> None:
        for name, st in self.cluster.statuses().items():
            if st and st.get("address"):
                self.addresses[name] = st["address"]

    def _settle(self, what: str) -> None:
        """Wait until the grid is balanced; the faults not yet recovered from get their recovery time."""
        try:
            self.cluster.wait_settled(what, SETTLE_TIMEOUT, None)
        except LocalError as exc:
            raise ChaosError(f"the grid did not recover: {exc}") from None
        now = time.monotonic()
        for f in self.faults:
            if f.recovered_after is None:
                f.recovered_after = round(now - f.started, 1)
        self.down = 0
        self._learn_addresses()
        self._check_capacities()

    def _check_capacities(self) -> None:
        """On a balanced grid, a member whose capacity a fault set to 0 owns no segment (else the change did
        not reach the coordinator's plan, or a merge forgot it)."""
        empty = [m for m in self.cluster.members if self.capacities.get(m.name) == 0]
        if not empty:
            return
        st = self.cluster.statuses(empty)
        for m in empty:
            g = (st.get(m.name) or {}).get("grid") or {}
            if g.get("capacity") != 0 or g.get("segments_owned") != 0:
                raise ChaosError(
                    f"{m.name} was set to capacity 0 but reports capacity {g.get('capacity')} and owns "
                    f"{g.get('segments_owned')} segments on a balanced grid"
                )
        self.capacity_checks += 1

    def inject(self, number: int, t0: float) -> FaultRecord:
        """Inject fault ``number`` (drawn by :attr:`schedule`) and start a replacement where one is due."""
        kind, victim_name, hold = self.schedule.draw(number, [m.name for m in self.cluster.members])
        victim = next(m for m in self.cluster.members if m.name == victim_name)
        now = time.monotonic()
        rec = FaultRecord(number, round(now - t0, 1), kind, victim.name, "", started=now)
        addr = self.addresses.get(victim.name, victim.name)
        if kind == "kill":
            self.log.add(addr, "crash")
            os.kill(victim.pid, signal.SIGKILL)
            proc = self.cluster.popen(victim.name)
            if proc is not None:
                proc.wait(10)
            self.cluster.prune()
            rec.detail = "SIGKILL"
            rec.replacement = self.cluster.spawn().name
        elif kind == "pause":
            os.kill(victim.pid, signal.SIGSTOP)
            try:
                time.sleep(hold)
            finally:
                os.kill(victim.pid, signal.SIGCONT)
            rec.detail = f"SIGSTOP {hold:.1f}s, SIGCONT"
            rec.length = round(hold, 1)
        elif kind == "cut":
            self.cut(victim, addr, hold, rec)
            rec.length = round(hold, 1)
        elif kind == CAPACITY:
            self.set_capacity(victim, rec)
        else:
            self.log.add(addr, "leave")
            code, body = post(victim.http + "/v1/leave")
            if code != 202:
                raise ChaosError(f"{victim.name} refused to leave: HTTP {code} {body}")
            deadline = time.monotonic() + SETTLE_TIMEOUT
            while self.cluster.alive(victim):
                if time.monotonic() > deadline:
                    raise ChaosError(f"{victim.name} did not finish leaving within {SETTLE_TIMEOUT:g}s")
                time.sleep(0.2)
            self.cluster.prune()
            rec.detail = "POST /v1/leave"
            rec.replacement = self.cluster.spawn().name
        self.down += 1
        self.faults.append(rec)
        extra = f", replaced by {rec.replacement}" if rec.replacement else ""
        self.say(f"  fault {number} at {rec.at:5.1f}s: {kind} {victim.name} ({rec.detail}{extra})")
        return rec

    def set_capacity(self, victim: MemberRecord, rec: FaultRecord) -> None:
        """Set ``victim``'s capacity to the schedule's next value, keeping ``num_owners`` members with capacity."""
        value = self.schedule.capacity()
        live = {m.name for m in self.cluster.members}
        old = self.capacities.get(victim.name, 1.0)
        holders = [n for n in live if n != victim.name and self.capacities.get(n, 1.0) > 0]
        note = ""
        if value == 0 and len(holders) < self.num_owners:
            value, note = 1.0, f", not 0: {self.num_owners} members keep capacity"
        code, body = post(victim.http + "/v1/capacity", {"capacity": value})
        if code != 202:
            raise ChaosError(f"{victim.name} refused capacity {value:g}: HTTP {code} {body}")
        self.capacities[victim.name] = value
        rec.detail = f"POST /v1/capacity {value:g} (was {old:g}{note})"

    def cut(self, victim: MemberRecord, addr: str, seconds: float, rec: FaultRecord) -> None:
        """Cut ``victim`` off from every other member for ``seconds``, then heal.

        Every live member (the victim too) gets the same partition {victim} | {the others} in its control
        file, so each side drops the other's frames: the others see the victim go silent and it sees them go
        silent, while both keep running and answering their clients (HTTP is not cut).
        """
        members = list(self.cluster.members)
        others = [m.bind for m in members if m is not victim]
        before = self._dropped(victim, members)
        started = time.monotonic()
        self.log.add(addr, "cut", phase="start", groups=[[victim.bind], others])
        try:
            self._control(members, partition_document([[victim.bind], others], seconds + CUT_SAFETY))
            time.sleep(max(0.0, seconds - (time.monotonic() - started)))
            rec.dropped = [n - b for n, b in zip(self._dropped(victim, members), before, strict=True)]
        finally:
            self._control(members, HEAL_DOCUMENT)
            self.log.add(addr, "cut", phase="end")
        by_victim, by_others = rec.dropped
        rec.detail = f"cut off {seconds:.1f}s, healed; frames dropped by it {by_victim}, by the others {by_others}"

    def _status_file(self, m: MemberRecord) -> dict[str, Any]:
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads((self.dir / f"{m.name}.status.json").read_text())
            if isinstance(doc, dict):
                return doc
        return {}

    def _control(self, members: list[MemberRecord], doc: dict[str, Any]) -> None:
        """Write ``doc`` into the members' control files and wait until every one applied it."""
        for m in members:
            write_control(self.cluster.faults_control_path(m.name), doc)
            self.applied[m.name] = self.applied.get(m.name, 0) + 1
        deadline = time.monotonic() + CONTROL_TIMEOUT
        waiting = list(members)
        while waiting:
            waiting = [
                m
                for m in waiting
                if ((self._status_file(m).get("faults_control") or {}).get("applied") or 0) < self.applied[m.name]
            ]
            if not waiting:
                return
            if time.monotonic() > deadline:
                why = {m.name: (self._status_file(m).get("faults_control") or {}) for m in waiting}
                raise ChaosError(f"members did not apply their faults control file within {CONTROL_TIMEOUT:g}s: {why}")
            time.sleep(0.1)

    def _dropped(self, victim: MemberRecord, members: list[MemberRecord]) -> list[int]:
        """Frames the victim's faults layer dropped so far, and the other members' together."""

        def dropped(m: MemberRecord) -> int:
            metrics = self._status_file(m).get("metrics") or {}
            return int(metrics.get("faults.partition_dropped", 0)) + int(
                metrics.get("faults.partition_dropped_down", 0)
            )

        return [dropped(victim), sum(dropped(m) for m in members if m is not victim)]

    # -- read-back and replicas ------------------------------------------------------------------------------
    def read_back(self, keys: list[bytes]) -> None:
        from ..grid.client import GridClient

        self.log.add("checker", "grid_converged")
        with GridClient([m.http for m in self.cluster.members], request_timeout=10.0, timeout=60.0) as client:
            for key in keys:
                timed_op(self.log, "final", "get", key, None, functools.partial(client.get, key))

    def record_stores(self) -> None:
        """A ``grid_store`` event per member: its copy of every segment it owns, scanned from it directly."""
        st = self.cluster.statuses()
        grids = {name: (s or {}).get("grid") or {} for name, s in st.items()}
        routing = next((s.get("routing") for s in st.values() if s and s.get("routing")), None)
        if not isinstance(routing, dict) or "owners" not in routing:
            raise ChaosError("no member reported a routing table after the grid converged")
        urls: list[str | None] = routing["members"]
        by_url = {m.http: m for m in self.cluster.members}
        owners = [[by_url[u].name for u in (urls[i] for i in seg) if u in by_url] for seg in routing["owners"]]
        by_name = {m.name: m for m in self.cluster.members}
        data: dict[str, dict[str, dict[str, str]]] = {m.name: {} for m in self.cluster.members}
        for s, seg_owners in enumerate(owners):
            for name in seg_owners:
                data[name][str(s)] = self._scan(by_name[name], s)
        for name, segs in data.items():
            self.log.add(name, "grid_store", topology_id=grids[name].get("topology_id"), owners=owners, data=segs)

    def _scan(self, m: MemberRecord, segment: int) -> dict[str, str]:
        out: dict[str, str] = {}
        after = ""
        while True:
            doc = get_json(f"{m.http}/v1/segments/{segment}?limit=1000{after}", timeout=10.0)
            if not doc or "entries" not in doc:
                raise ChaosError(f"{m.name} did not serve segment {segment}: {doc}")
            for k, v, _ in doc["entries"]:
                out[_text(base64.b64decode(k)) or ""] = _text(base64.b64decode(v)) or ""
            if not doc.get("next"):
                return out
            after = f"&after={doc['next']}"

    def grid_params(self) -> list[str]:
        """The members' grid parameters. The clients give up on a member after REQUEST_TIMEOUT and retry on
        another; the member's own operation must be over by then (its last attempt sent before op_timeout,
        held at most attempt_timeout by the owner), or it could still take effect after the retry and after
        later writes of the same key (a cut member's operation did, once the cut healed). The client's own
        defaults keep the same rule (35 s requests, 30 s operations)."""
        return [f"num_owners={self.num_owners}", f"op_timeout={OP_TIMEOUT:g}s", f"attempt_timeout={ATTEMPT_TIMEOUT:g}s"]

    # -- the whole run ---------------------------------------------------------------------------------------
    def run(self) -> ChaosResult:
        began = time.monotonic()
        self.say(f"starting {self.members} members in {self.dir} (seed {self.seed}, num_owners {self.num_owners})")
        try:
            took = self.cluster.start(self.members, grid_params=self.grid_params(), timeout=START_TIMEOUT)
        except LocalError as exc:
            raise ChaosError(f"the cluster did not start: {exc}") from None
        self._learn_addresses()
        self.say(f"{self.members} members formed one grid in {took:.1f}s; writer and reader running")
        workload = Workload(lambda: [m.http for m in self.cluster.members], self.log, self.seed)
        workload.start()
        t0 = time.monotonic()
        end = t0 + self.minutes * 60
        number = 0
        while True:
            gap = self.schedule.gap()
            if time.monotonic() + gap >= end:
                break
            time.sleep(gap)
            if self.down + 1 > self.num_owners - 1:
                # One more member down would exceed num_owners - 1: wait until the grid is balanced again.
                self._settle("the grid to recover before the next fault")
                if time.monotonic() >= end:
                    break
            number += 1
            self.inject(number, t0)
        time.sleep(max(0.0, end - time.monotonic()))
        self.say(f"faults stopped after {time.monotonic() - t0:.0f}s; waiting for the grid to converge")
        self._settle("the grid to converge")
        workload.finish()
        keys = sorted(workload.written)
        self.say(f"reading back {len(keys)} keys")
        self.read_back(keys)
        self.record_stores()
        return self.judge(workload, len(keys), time.monotonic() - began)

    def merged_history(self) -> list[dict[str, Any]]:
        events = list(self.log.events)
        for path in sorted(self.dir.glob("m*.history.jsonl")):
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    # Only the kinds the grid checkers read: the members' sends and deliveries are many.
                    if '"kind": "view"' not in line and not any(f'"kind": "{k}"' in line for k in MEMBER_KINDS):
                        continue
                    with contextlib.suppress(ValueError):
                        ev = json.loads(line)
                        if ev.get("kind") in MEMBER_KINDS:
                            events.append(ev)
        events.sort(key=lambda e: e["t"])
        return events

    def judge(self, workload: Workload, keys: int, duration: float) -> ChaosResult:
        from ..sim.history import History

        events = self.merged_history()
        path = self.dir / HISTORY_FILE
        with open(path, "w", encoding="utf-8") as fh:
            for ev in events:
                fh.write(json.dumps(ev) + "\n")
        violations, samples, lost_keys = check_history(History.read(path))
        ops = sum(1 for e in events if e["kind"] == "grid_start")
        return ChaosResult(
            seed=self.seed,
            minutes=self.minutes,
            members=self.members,
            num_owners=self.num_owners,
            faults=self.faults,
            ops=ops,
            op_counts=dict(workload.counts),
            keys_checked=keys,
            violations=violations,
            samples=samples,
            lost=len(lost_keys),
            lost_keys=sorted(lost_keys)[:20],
            duration=round(duration, 1),
            history=str(path),
            errors=list(workload.errors),
            capacity_checks=self.capacity_checks,
        )


def check_history(history: Any) -> tuple[dict[str, int], list[str], set[str]]:
    """Run the grid checkers over a chaos history: violations per checker, a few samples, the keys lost.

    A key is lost when its read-back after convergence returned a value no write allows
    (``grid-lost-write``) or failed: a key that cannot be read back cannot be shown to hold its value.
    """
    from ..sim.grid.checkers import GRID_CHECKERS

    violations: dict[str, int] = {}
    samples: list[str] = []
    lost_keys: set[str] = set()
    for name, check in GRID_CHECKERS.items():
        found = check(history)
        violations[name] = len(found)
        samples += [f"{v.property} {v.member}: {v.detail}" for v in found[:3]]
        if name == "grid-lost-write":
            lost_keys |= {_key_of(v.detail) for v in found}
    finals = {e.data["id"]: e for e in history.events if e.kind == "grid_start" and e.member == "final"}
    for e in history.events:
        if e.kind == "grid_end" and e.data.get("id") in finals and not e.data.get("ok"):
            lost_keys.add(str(finals[e.data["id"]].data.get("key")))
    return violations, samples, lost_keys


def _key_of(detail: str) -> str:
    """The key named in a read violation's text (``... of 'k012' at ...``)."""
    _, _, rest = detail.partition(" of ")
    return rest.split(" at t=", 1)[0].strip("'\"") if rest else detail


# ==== report ====================================================================================================
def format_report(r: ChaosResult) -> str:
    lines = [f"faults (seed {r.seed}):"]
    header = ["#", "at", "kind", "member", "how", "replacement", "balanced after"]
    rows = [
        [
            str(f.number),
            f"{f.at:.1f}s",
            f.kind,
            f.member,
            f.detail,
            f.replacement or "-",
            "-" if f.recovered_after is None else f"{f.recovered_after:.1f}s",
        ]
        for f in r.faults
    ]
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    kinds = Counter(f.kind for f in r.faults)
    lines.append("")
    lines.append("figures:")
    figures = [
        ("run", f"{r.duration:.0f}s, {r.members} members, num_owners {r.num_owners}"),
        ("faults", ", ".join(f"{kinds.get(k, 0)} {k}" for k in (*KINDS, *(k for k in kinds if k not in KINDS)))),
        ("operations", ", ".join(f"{n} {k}" for k, n in sorted(r.op_counts.items())) or "none"),
        ("keys read back", str(r.keys_checked)),
        *(
            [("capacity checks", f"{r.capacity_checks} balanced grids with every member at capacity 0 owning nothing")]
            if kinds.get(CAPACITY)
            else []
        ),
        *((f"checker {name}", f"{n} violations") for name, n in r.violations.items()),
        ("history", r.history),
    ]
    w = max(len(k) for k, _ in figures)
    lines += [f"  {k.ljust(w)}  {v}" for k, v in figures]
    if r.samples:
        lines.append("")
        lines.append("violations (first of each checker):")
        lines += [f"  {s}" for s in r.samples]
    if r.lost_keys:
        lines.append(f"lost keys: {', '.join(r.lost_keys)}")
    if r.errors:
        lines.append("workload errors:")
        lines += [f"  {e}" for e in r.errors]
    return "\n".join(lines)


# ==== command line ==============================================================================================
def _minutes(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0 < v <= 24 * 60:
        raise argparse.ArgumentTypeError(f"expected minutes between 0 and 1440 (e.g. 1 or 0.5), got {text!r}")
    return v


def _seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a seed: a whole number >= 0, got {text!r}")
    return v


def _members(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if not DEFAULT_OWNERS + 1 <= v <= MAX_MEMBERS:
        raise argparse.ArgumentTypeError(
            f"expected {DEFAULT_OWNERS + 1} to {MAX_MEMBERS} members (more than num_owners {DEFAULT_OWNERS}, "
            f"so a replacement always has a surviving copy to take over), got {text!r}"
        )
    return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--minutes", type=_minutes, required=True, metavar="N", help="how long faults are injected (e.g. 1, 0.5)"
    )
    parser.add_argument(
        "--seed", type=_seed, required=True, metavar="S", help="seeds the fault schedule (same seed, same faults)"
    )
    parser.add_argument("--members", type=_members, default=4, metavar="M", help="members of the cluster (default 4)")
    parser.add_argument(
        "--dir", metavar="D", help="keep the cluster's state, logs and history here (default: a temp dir)"
    )
    parser.add_argument(
        "--capacity-changes",
        action="store_true",
        help="capacity changes are faults too: POST /v1/capacity 0, 0.5, 1 or 2 to a member (num_owners keep some)",
    )
    parser.add_argument("--json", action="store_true", help="the report as one JSON line (before the last line)")


def run(args: argparse.Namespace) -> int:
    if args.dir:
        directory = Path(args.dir).resolve()
        if (directory / "cluster.json").exists():
            print(
                f"groupcluster chaos: error: --dir {directory} already holds a cluster; use an empty directory",
                file=sys.stderr,
            )
            return 2
        directory.mkdir(parents=True, exist_ok=True)
    else:
        directory = Path(tempfile.mkdtemp(prefix="groupcluster-chaos-"))
    out: TextIO = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    chaos = Chaos(
        directory,
        minutes=args.minutes,
        seed=args.seed,
        members=args.members,
        capacity_changes=args.capacity_changes,
        say=say,
    )
    result: ChaosResult | None = None
    try:
        result = chaos.run()
    except ChaosError as exc:
        print(f"groupcluster chaos: error (seed {args.seed}): {exc}", file=sys.stderr)
        print(f"groupcluster chaos: logs kept in {directory}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"groupcluster chaos: interrupted (seed {args.seed}); logs in {directory}", file=sys.stderr)
        return 130
    finally:
        chaos.cluster.stop(grace=5.0)
        chaos.cluster.kill_all()
    if result.ok and not args.dir:
        result.history = "not kept (a clean run in a temporary directory; --dir D keeps it)"
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(format_report(result))
    if result.ok and not args.dir:
        shutil.rmtree(directory, ignore_errors=True)
    elif not result.ok:
        again = " --capacity-changes" if args.capacity_changes else ""
        print(f"replay: groupcluster chaos --minutes {args.minutes:g} --seed {args.seed}{again}; logs in {directory}")
    print(result.summary(), flush=True)
    return 0 if result.ok else 1
