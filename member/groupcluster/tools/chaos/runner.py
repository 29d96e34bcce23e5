"""One chaos run (:class:`Chaos`): start the cluster, inject the scheduled faults while the workload runs,
settle, read every key back, scan every owner's copy, and judge the merged history."""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...runtime.faults_control import HEAL_DOCUMENT, partition_document, write_control
from ..local_cluster import DEFAULT_OWNERS, LocalCluster, LocalError, MemberRecord, get_json, post
from .errors import ChaosError
from .faults import CAPACITY, FaultRecord, FaultSchedule
from .judgement import check_history
from .report import ChaosResult
from .workload import ATTEMPT_TIMEOUT, OP_TIMEOUT, HistoryLog, Workload, as_text, timed_op

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
        from ...grid.client import GridClient

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
                out[as_text(base64.b64decode(k)) or ""] = as_text(base64.b64decode(v)) or ""
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
        from ...sim.history import History

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
