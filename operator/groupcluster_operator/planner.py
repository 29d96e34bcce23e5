"""The pure scaling planner: from the spec, the pods and what the members report, the next step.

:func:`plan` is called on every reconciliation (a kopf timer) with what the handler observed (the pods and
the members' reports, read by :mod:`groupcluster_operator.observations`); it returns a
:class:`Plan`: the actions to execute now (create a pod, ask a member to leave, delete a pod), or none (wait),
the status to write and the events to post. It keeps no state: everything it needs to remember lives on the pods as
annotations (a leave was asked for, which spec a pod runs) or in the status the last step wrote (the failures,
the pods deleted by someone else and not replaced yet), so an operator restart picks up where the last one
stopped.

The rules, in the order they are checked:

1. A member pod that finished (it left, or its process died) is deleted; one that died unexpectedly is
   reported as a Warning event, and the steps below replace it. Unexpected exits in a row are counted (the
   status' ``failures``, reset once the cluster is Ready or the spec changes): the first is replaced at
   once, later ones after a back-off (:func:`failure_backoff`), and meanwhile the failed pod is kept, so its
   state and log can be read, and no new pod is created (phase ``Failing``).
2. While any member is leaving (a leave was asked for) or any pod is terminating, nothing else starts: the
   leave must finish first (its data handed off). A leaving member that says it is not leaving (the request
   was lost) is asked again.
3. While a pod is starting (not ready: not joined yet, or its state transfer not finished), wait. A new
   member counts as ready only then, so pods are added one at a time. A starting pod that cannot start (its
   image cannot be pulled, it cannot be scheduled, ...) makes the phase ``Failing`` with the reason; if it
   runs an old spec (the user fixed the image, say) it is deleted, so the fix is not stuck behind it. One
   exception: a join-only member (see below) that is the only pod left and reports no grid topology can never
   start: it is deleted, and rule 4 then creates a cluster's first member in its place.
4. Fewer members than wanted: create one (the lowest free ordinal). A member pod someone else deleted stays in
   the status' ``pendingReplacements`` until a pod is created for it (or fewer pods are missing than are
   listed): the step that first sees it gone may be held by a rule above, and its replacement still says whom
   it replaces.
5. More members than wanted: once the group is well formed and no rebalance runs, ask up to
   ``max(1, numOwners-1)`` members to leave, preferring members on an old spec, then members that are not the
   coordinator, then the highest ordinal; the coordinator leaves last. A pod is deleted only after its member
   left (the process exits once its segments have new owners). Scaling to 0 stops the last member at once:
   nobody is left to take its segments.
6. As many as wanted but some run an old spec (image or settings changed): once the group is stable, add one
   member on the new spec; rule 5 then asks one old member to leave. Members roll one at a time, the
   coordinator last, and the cluster never has fewer members than wanted.

Every pod created while k members are ready (k >= 1) is **join-only**: its member starts with the grid's
``initial_cluster_size`` at k+1, so it cannot start a grid of its own when its join fails (a discovery race, a
network blip) and it forms a group alone: that would need k+1 members none of which holds a topology, i.e. the
whole old cluster gone. Without it, that member would start a second, empty grid and turn Ready, and at a later
merge writes acknowledged on one grid could be lost to older writes of the other (simulation seed 513). The
first pod of a cluster with no ready member gets 1. The value is per pod, not part of the spec hash.

Two guards override the rules above (the cluster is reported Degraded, with a Warning event, until fixed):

* The cluster Secret is missing or unusable (the handler passes ``auth_problem``): no pod is created or
  replaced and no member is asked to leave (that needs the Secret's admin token); finished pods are still
  deleted.
* A member would be created whose frame authentication (``spec.auth``: off, HMAC, encrypted) differs from
  the running members': the two could not read each other's frames, so the new member would form a group of
  its own. No pod is created; leaves still proceed, so scaling to 0 and back applies the change.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .model import (
    ClusterSpec,
)
from .observations import MemberReport, PodState

# Back-off between replacements of members that keep exiting: 5 s doubling to 5 minutes (the kubelet's
# CrashLoopBackOff runs from 10 s to 5 minutes); the first exit is replaced at once.
FAILURE_BACKOFF_START = 5
FAILURE_BACKOFF_MAX = 300


def failure_backoff(count: int) -> int:
    """Seconds before a member is replaced after ``count`` unexpected exits in a row (0: at once).

    A single exit (a crash, a killed process, a lost node) says nothing about the next member, so it is replaced
    at once; from the second in a row on, the image or the settings are the likelier cause, and creating pods as
    fast as they die only floods the cluster with them.
    """
    if count <= 1:
        return 0
    return int(min(FAILURE_BACKOFF_START * 2 ** (count - 2), FAILURE_BACKOFF_MAX))


def _parse_time(text: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except (TypeError, ValueError):
        return None


def _format_time(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


# -- outputs -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CreatePod:
    ordinal: int
    reason: str
    # The member's grid initial_cluster_size: one more than the members ready when the planner decided, so a
    # member whose join fails cannot start a grid of its own (1 for the first member of a cluster). No default:
    # every creator must decide, as a forgotten 1 is exactly the hazard.
    initial_cluster_size: int


@dataclass(frozen=True)
class RequestLeave:
    pod: str
    reason: str


@dataclass(frozen=True)
class DeletePod:
    pod: str
    reason: str
    # None: the pod's own grace period (a member still running gets SIGTERM and hands its data off first).
    grace_seconds: int | None = None


Action = CreatePod | RequestLeave | DeletePod


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    phase: str = "Running"
    message: str = ""
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    @property
    def waiting(self) -> bool:
        return not self.actions


# -- the planner -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Observed:
    active: list[PodState]  # running or starting, not leaving, not finished, not terminating
    leaving: list[PodState]
    terminating: list[PodState]
    finished: list[PodState]
    well_formed: bool
    view_id: str | None
    rebalancing: bool
    degraded_reasons: list[str]  # members that do not answer
    coordinator_pod: str | None
    grid_degraded: MemberReport | None  # the report (the coordinator's if it says so) of a degraded topology
    pod_of: dict[str, str]  # member address -> pod name


def _observe(pods: Sequence[PodState], reports: Mapping[str, MemberReport | None]) -> _Observed:
    active = [p for p in pods if not p.deleting and not p.finished and not p.leave_requested]
    leaving = [p for p in pods if not p.deleting and not p.finished and p.leave_requested]
    terminating = [p for p in pods if p.deleting]
    finished = [p for p in pods if p.finished]
    live = active + leaving
    got = {p.name: reports.get(p.name) for p in live}
    joined = {n: r for n, r in got.items() if r is not None and r.joined}
    views = {r.view_id for r in joined.values()}
    addresses = {r.address for r in joined.values()}
    view_members = {frozenset(r.view_members) for r in joined.values()}
    well_formed = bool(live) and len(joined) == len(live) and len(views) == 1 and view_members == {frozenset(addresses)}
    rebalancing = any(
        r.grid_phase not in (None, "NO_REBALANCE") or r.segments_to_fetch > r.segments_fetched for r in joined.values()
    )
    degraded: list[str] = []
    for p in live:
        if p.phase == "Running" and p.ip and got.get(p.name) is None and p.ready:
            degraded.append(f"member {p.name} does not answer on its HTTP API")
    coordinators = {r.coordinator for r in joined.values() if r.coordinator}
    by_address = {r.address: n for n, r in joined.items()}
    coordinator_pod = by_address.get(next(iter(coordinators))) if len(coordinators) == 1 else None
    # The coordinator decides the topology: its word counts first; any member's, if it gave none.
    reporting = sorted(joined.items(), key=lambda item: item[0] != coordinator_pod)
    grid_degraded = next((r for _, r in reporting if r.availability not in (None, "AVAILABLE")), None)
    return _Observed(
        active=active,
        leaving=leaving,
        terminating=terminating,
        finished=finished,
        well_formed=well_formed,
        view_id=next(iter(views)) if well_formed else None,
        rebalancing=rebalancing,
        degraded_reasons=degraded,
        coordinator_pod=coordinator_pod,
        grid_degraded=grid_degraded,
        pod_of=by_address,
    )


def _member_ready(p: PodState, reports: Mapping[str, MemberReport | None]) -> bool:
    r = reports.get(p.name)
    return p.ready and r is not None and r.joined and r.grid_ready and not r.leaving


def _initial_cluster_size(ready: Sequence[PodState]) -> int:
    """A new member's grid ``initial_cluster_size``: join-only (k+1) while k members are ready, else 1.

    Every ready member holds a grid topology (``/readyz``), so with k+1 the new member can only join theirs:
    a new grid would need k+1 members without one, i.e. the whole old cluster gone. With none ready it is the
    cluster's first member and must start the grid alone (the next pod is created only once it is ready).
    """
    return len(ready) + 1


def _stranded_joiner(obs: _Observed, reports: Mapping[str, MemberReport | None]) -> PodState | None:
    """A join-only member that can never start: the only member left, and it says it holds no grid topology.

    It would need ``initial_cluster_size`` members without a topology, and the planner adds no pod while one
    is starting: without this it would wait forever. It must say so itself (answer with no topology): one that
    does not answer may hold the last copies (it joined, then everybody else died), and is left alone.
    """
    if len(obs.active) != 1 or obs.leaving or obs.terminating:
        return None
    (p,) = obs.active
    r = reports.get(p.name)
    if p.initial_cluster_size <= 1 or _member_ready(p, reports) or r is None or r.topology_id is not None:
        return None
    return p


def choose_leavers(
    active: Sequence[PodState], count: int, spec_hash: str, coordinator_pod: str | None
) -> list[PodState]:
    """Who leaves first: members on an old spec, then not the coordinator, then the highest ordinal."""

    def key(p: PodState) -> tuple[int, int, int]:
        return (0 if p.spec_hash != spec_hash else 1, 1 if p.name == coordinator_pod else 0, -p.ordinal)

    return sorted(active, key=key)[:count]


def free_ordinal(pods: Iterable[PodState]) -> int:
    used = {p.ordinal for p in pods}
    n = 0
    while n in used:
        n += 1
    return n


@dataclass
class Failures:
    """Unexpected member exits in a row (the status' ``failures``): what paces their replacement.

    ``seen`` names the failed pods already counted (they stay while a back-off runs), so each exit counts once.
    The count starts afresh when the spec changes (a new image may well fix it) and once the cluster is Ready.
    """

    count: int = 0
    last_pod: str = ""
    last_reason: str = ""
    last_time: str = ""
    seen: tuple[str, ...] = ()
    spec_hash: str = ""

    @classmethod
    def from_status(cls, raw: Any, spec_hash: str) -> Failures:
        if not isinstance(raw, Mapping):
            return cls(spec_hash=spec_hash)
        seen = tuple(str(n) for n in raw.get("failedPods") or ())
        if raw.get("specHash") != spec_hash:
            return cls(seen=seen, spec_hash=spec_hash)
        count = raw.get("count")
        return cls(
            count=count if type(count) is int and count > 0 else 0,
            last_pod=str(raw.get("lastPod") or ""),
            last_reason=str(raw.get("lastReason") or ""),
            last_time=str(raw.get("lastTime") or ""),
            seen=seen,
            spec_hash=spec_hash,
        )

    def retry_at(self) -> datetime.datetime | None:
        """When the next replacement may be created (None: at once)."""
        last = _parse_time(self.last_time)
        delay = failure_backoff(self.count)
        return None if last is None or not delay else last + datetime.timedelta(seconds=delay)

    def wait_seconds(self, now: str) -> int:
        at, current = self.retry_at(), _parse_time(now)
        if at is None or current is None:
            return 0
        return max(0, math.ceil((at - current).total_seconds()))

    def to_status(self) -> dict[str, Any]:
        at = self.retry_at()
        return {
            "count": self.count,
            "lastPod": self.last_pod,
            "lastReason": self.last_reason,
            "lastTime": self.last_time,
            "retryAfter": _format_time(at) if at is not None else "",
            "failedPods": list(self.seen),
            "specHash": self.spec_hash,
        }


def _grid_degraded_text(spec: ClusterSpec, r: MemberReport) -> str:
    """Why the grid is degraded and what that means, from the (coordinator's) report."""
    total = r.num_segments or spec.num_segments
    if r.segments_unavailable:
        what = (
            f"{r.segments_unavailable} of {total} segments have no owner left (their data is gone unless the "
            "members that held them come back)"
        )
    else:
        what = "every segment still has an owner, but too many members left at once to rule out a network partition"
    effect = {
        "DenyReadWrites": "reads and writes are refused",
        "AllowReads": "writes are refused",
    }.get(spec.partition_handling, "reads and writes go on")
    return (
        f"the grid is degraded: {what}; {effect} (partitionHandling {spec.partition_handling}) and new members "
        "cannot receive data until the missing members return or availability is forced (POST "
        "/v1/force-available on the coordinator, see docs/operator.md)"
    )


def _short_view(view_id: str | None, size: int, pod_of: Mapping[str, str]) -> str:
    """``demo-0|7, 3 members``: the view's creator as a pod name (its address if no pod has it), its sequence."""
    if not view_id:
        return ""
    creator, _, seq = view_id.rpartition("|")
    return f"{pod_of.get(creator, creator)}|{seq}, {size} member{'s' if size != 1 else ''}"


@dataclass
class _Step:
    """What one planning step observed and is building, shared by the rules below (each fills ``out``)."""

    spec: ClusterSpec
    spec_hash: str
    pods: Sequence[PodState]
    reports: Mapping[str, MemberReport | None]
    now: str
    prev: dict[str, Mapping[str, Any]]  # the previous conditions by type
    obs: _Observed
    fail: Failures
    was_deleted: set[str]
    deleted_by_others: set[str]
    vanished: list[str]
    # Members deleted by someone else whose replacement is still due, oldest first (the status'
    # ``pendingReplacements``): the step that sees a pod vanish may be held by another rule, and the rule that
    # adds the member must still say whom it replaces.
    pending: list[str]
    out: Plan = field(default_factory=Plan)
    ready: list[PodState] = field(default_factory=list)
    starting: list[PodState] = field(default_factory=list)
    outdated: list[PodState] = field(default_factory=list)
    waiting_join: list[PodState] = field(default_factory=list)
    replacing: str | None = None  # the pending replacement this step's CreatePod is for

    @property
    def desired(self) -> int:
        return self.spec.replicas

    @property
    def n(self) -> int:
        return len(self.obs.active)


def plan(
    spec: ClusterSpec,
    pods: Sequence[PodState],
    reports: Mapping[str, MemberReport | None],
    *,
    spec_hash: str | None = None,
    previous_conditions: Sequence[Mapping[str, Any]] = (),
    previous_status: Mapping[str, Any] | None = None,
    now: str = "",
    auth_problem: str | None = None,
) -> Plan:
    """The next step for one GroupCluster (see the module docstring for the rules and the guards).

    ``previous_status`` is the status the last step wrote (its conditions, unless ``previous_conditions`` are
    given, its failure count, its members, its pending replacements); ``now`` is the time as ``YYYY-MM-DDTHH:MM:SSZ``.
    """
    s = _begin(spec, pods, reports, spec_hash, previous_conditions, previous_status, now)
    # 1. finished pods: delete (and say why they finished); unexpected exits in a row are paced.
    _finished_pods(s)
    _members_seen(s)
    _report_vanished(s)
    # 2. leaves and terminations in progress: let them finish.
    if s.obs.leaving or s.obs.terminating:
        _leaves_in_progress(s)
    # 3. starting pods: one join at a time (a stranded join-only member is replaced by a first member).
    elif stranded := _stranded_joiner(s.obs, reports):
        _replace_stranded(s, stranded)
    elif s.starting:
        _starting_pods(s)
    # 4. too few members: add one.
    elif s.n < s.desired:
        _add_member(s)
    # 5. too many members: graceful leaves, bounded by numOwners-1, once the grid is settled.
    elif s.n > s.desired:
        _retire_members(s)
    # 6. the right number but an old spec: surge one new member (rule 5 then retires an old one).
    elif s.outdated and s.desired > 0:
        _surge_for_new_spec(s)
    else:
        _steady(s)
    _back_off(s)
    degraded, reason = _degraded(s, auth_problem)
    out = s.out
    if out.phase == "Running":
        s.fail = Failures(spec_hash=s.spec_hash)  # Ready again: the next exit is replaced at once
    # Pods this step asks to leave or deletes count as leaving from now on: gone at the next step, they are not
    # someone else's deletion.
    sent_off = {a.pod for a in out.actions if isinstance(a, RequestLeave | DeletePod)}
    pending = _still_pending(s)
    out.status = _status(
        spec,
        s.spec_hash,
        pods,
        reports,
        s.obs,
        s.ready,
        out,
        s.prev,
        now,
        degraded,
        reason,
        s.fail,
        s.deleted_by_others,
        sent_off,
        pending,
    )
    return out


def _begin(
    spec: ClusterSpec,
    pods: Sequence[PodState],
    reports: Mapping[str, MemberReport | None],
    spec_hash: str | None,
    previous_conditions: Sequence[Mapping[str, Any]],
    previous_status: Mapping[str, Any] | None,
    now: str,
) -> _Step:
    """What the step starts from: the observations, the previous status' conditions, failures and members."""
    spec_hash = spec_hash or spec.pod_hash()
    previous = previous_status or {}
    if not previous_conditions:
        previous_conditions = previous.get("conditions") or ()
    prev = {str(c.get("type")): c for c in previous_conditions if isinstance(c, Mapping)}
    obs = _observe(pods, reports)
    fail = Failures.from_status(previous.get("failures"), spec_hash)
    names = {p.name for p in pods}
    # Pods deleted by someone else (kubectl delete pod, a drain): neither a leave the operator asked for nor a
    # deletion of its own (the operator annotates every pod it deletes, finished ones too). Its phase says
    # nothing: a deleted member that hands its data off and leaves is Succeeded, possibly before any step saw
    # it running and terminating.
    last_members = {str(m.get("pod")): m for m in previous.get("members") or () if isinstance(m, Mapping)}
    was_deleted = {name for name, m in last_members.items() if m.get("deleted")}
    deleted_by_others = {p.name for p in obs.terminating if not p.leave_requested and not p.stopped_by_operator}
    # Members of the last step that are gone though the operator neither asked them to leave nor deleted them
    # (the status marks those as leaving): deleted by someone else, seen terminating or not (a member that
    # leaves quickly on SIGTERM can be gone before the next step).
    vanished = sorted(
        name for name, m in last_members.items() if name not in names and (m.get("deleted") or not m.get("leaving"))
    )
    # Remembered until a pod replaces them: a pod of the same name exists again only once the operator made it.
    remembered = [str(n) for n in previous.get("pendingReplacements") or () if isinstance(n, str)]
    pending = [n for n in dict.fromkeys([*remembered, *vanished]) if n not in names]
    return _Step(
        spec=spec,
        spec_hash=spec_hash,
        pods=pods,
        reports=reports,
        now=now,
        prev=prev,
        obs=obs,
        fail=fail,
        was_deleted=was_deleted,
        deleted_by_others=deleted_by_others,
        vanished=vanished,
        pending=pending,
    )


def _finished_pods(s: _Step) -> None:
    """Rule 1: delete the finished pods, one Warning per unexpected exit, the replacement paced by the back-off."""
    out, fail, spec_hash, now, desired = s.out, s.fail, s.spec_hash, s.now, s.desired
    finished = []
    for p in s.obs.finished:
        finished.append(p.name)
        if p.leave_requested and p.phase == "Succeeded":
            out.actions.append(DeletePod(p.name, "left the group after handing its data off"))
            out.events.append(Event("Normal", "MemberLeft", f"member {p.name} left the group; deleting its pod"))
            continue
        what = p.exit_text
        new = p.name not in fail.seen
        # An exit on an old spec says nothing about the current one: it is replaced at once, not counted.
        current = p.spec_hash == spec_hash
        if new and current:
            fail.count += 1
            fail.last_pod, fail.last_reason, fail.last_time = p.name, what, now
        # No back-off where nothing replaces it (replicas 0): the failed pod just goes.
        wait = fail.wait_seconds(now) if current and desired else 0
        if new:
            times = f"; {fail.count} exits in a row" if current and fail.count > 1 else ""
            when = f"replacing it in {wait} s (back-off)" if wait else "replacing it"
            out.events.append(
                Event("Warning", "MemberDied", f"member {p.name} exited unexpectedly ({what}){times}; {when}")
            )
        if not wait:
            out.actions.append(DeletePod(p.name, f"member exited unexpectedly: {what}"))
        # Else the failed pod stays until the back-off ends: `kubectl describe` and `kubectl logs` still work.
    fail.seen = tuple(finished)


def _members_seen(s: _Step) -> None:
    """The active members by state: ready, starting (not ready yet), on an old spec."""
    s.ready = [p for p in s.obs.active if _member_ready(p, s.reports)]
    s.starting = [p for p in s.obs.active if not _member_ready(p, s.reports)]
    s.outdated = [p for p in s.obs.active if p.spec_hash != s.spec_hash]


def _report_vanished(s: _Step) -> None:
    """One event per member pod someone else deleted that is gone since the last step."""
    # As many of the pending replacements as pods are missing are made, the oldest first.
    due = s.pending[: max(0, s.desired - s.n)]
    for name in s.vanished:
        if name not in s.was_deleted:
            replaced = "a new member replaces it" if name in due else "it is not replaced"
            s.out.events.append(
                Event("Normal", "MemberDeleted", f"member pod {name} was deleted (not by the operator); {replaced}")
            )


def _leaves_in_progress(s: _Step) -> None:
    """Rule 2: wait for the leaves and terminations; ask again a leaving member that says it is not leaving."""
    obs, out, reports, n, desired = s.obs, s.out, s.reports, s.n, s.desired
    for p in obs.leaving:
        r = reports.get(p.name)
        if r is not None and r.joined and not r.leaving:
            out.actions.append(RequestLeave(p.name, "a leave was asked for but the member is not leaving"))
    deleted = [p for p in obs.terminating if p.name in s.deleted_by_others]
    going = [p.name for p in obs.leaving + obs.terminating if p not in deleted]
    waits = [f"{', '.join(going)} to leave"] if going else []
    if deleted:
        waits.append(f"{', '.join(p.name for p in deleted)} to stop (pod deleted; it hands its data off first)")
    for p in deleted:
        if p.name not in s.was_deleted:
            out.events.append(
                Event(
                    "Normal",
                    "MemberDeleted",
                    f"member pod {p.name} is being deleted: its member hands its data off and leaves; "
                    + ("a new member replaces it" if n < desired else "it is not replaced"),
                )
            )
    out.message = "waiting for " + " and ".join(waits)
    out.phase = "ScalingDown" if n >= desired or obs.leaving else "ScalingUp"


def _replace_stranded(s: _Step, stranded: PodState) -> None:
    """Rule 3's exception: delete the stranded join-only member, so rule 4 creates a first member."""
    out, desired = s.out, s.desired
    why = (
        f"it was created to join a running grid (initial_cluster_size={stranded.initial_cluster_size}) but "
        "no other member is left, so it can never start one"
    )
    if desired:
        why += "; a new first member replaces it (the grid starts empty: every member that held it is gone)"
    # It holds no data (no topology): there is nothing to hand off, so no long grace period.
    out.actions.append(DeletePod(stranded.name, f"stranded join-only member: {why}", grace_seconds=5))
    out.events.append(Event("Warning", "MemberStranded", f"deleting member pod {stranded.name}: {why}"))
    out.phase = "ScalingUp" if desired else "ScalingDown"
    out.message = f"deleting the stranded join-only member {stranded.name}"


def _starting_pods(s: _Step) -> None:
    """Rule 3: wait for the starting pods; report those that cannot start, delete those on an old spec."""
    out, starting = s.out, s.starting
    stuck = [p for p in starting if p.stuck]
    out.phase = "ScalingUp" if s.n <= s.desired else "ScalingDown"
    if stuck:
        out.phase = "Failing"
        out.message = "; ".join(f"{p.name} cannot start: {p.stuck}" for p in stuck)
        ready_before = s.prev.get("Ready") or {}
        reported = str(ready_before.get("message") or "") if ready_before.get("reason") == "MemberFailing" else ""
        for p in stuck:
            if p.spec_hash != s.spec_hash:
                # It never joined (nothing to hand off), and it waits for the spec the user just changed.
                why = "it cannot start and runs an old spec; a member on the new spec replaces it"
                out.actions.append(DeletePod(p.name, why, grace_seconds=5))
                out.events.append(Event("Normal", "MemberReplaced", f"deleting member pod {p.name}: {why}"))
            elif f"{p.name} cannot start:" not in reported:
                out.events.append(Event("Warning", "MemberFailing", f"member pod {p.name} cannot start: {p.stuck}"))
    else:
        s.waiting_join = starting
        out.message = f"waiting for {', '.join(p.name for p in starting)} to join and receive its data"


def _add_member(s: _Step) -> None:
    """Rule 4: create one member, at the lowest free ordinal."""
    obs, out, n, desired = s.obs, s.out, s.n, s.desired
    ordinal = free_ordinal(s.pods)
    name = f"{s.spec.name}-{ordinal}"
    reason = f"scaling up: {n} of {desired} members"
    if obs.finished and any(not (p.leave_requested and p.phase == "Succeeded") for p in obs.finished):
        reason = f"replacing a member that died: {n} of {desired} members"
    elif s.pending:
        # One pod replaces one deleted member: the one of its own name if there is one (the lowest free
        # ordinal often is the deleted pod's), else the oldest; the others stay pending for the next steps.
        s.replacing = name if name in s.pending else s.pending[0]
        reason = f"replacing {s.replacing} (pod deleted): {n} of {desired} members"
    out.actions.append(CreatePod(ordinal, reason, _initial_cluster_size(s.ready)))
    out.events.append(Event("Normal", "MemberCreated", f"creating member pod {name} ({reason})"))
    out.phase, out.message = "ScalingUp", reason


def _still_pending(s: _Step) -> list[str]:
    """The pending replacements the next step inherits (after the back-off and the guards dropped actions).

    The one this step creates a pod for is done; and no more stay than pods are still missing (a scale-down,
    or members created meanwhile for another reason, leave nothing to replace).
    """
    created = any(isinstance(a, CreatePod) for a in s.out.actions)
    left = [n for n in s.pending if not (created and n == s.replacing)]
    return left[: max(0, s.desired - s.n - (1 if created else 0))]


def _retire_members(s: _Step) -> None:
    """Rule 5: ask up to ``max_leaving`` members to leave once the group is settled (stop the last one)."""
    obs, out, n, desired, spec_hash = s.obs, s.out, s.n, s.desired, s.spec_hash
    rolling = bool(s.outdated) and n == desired + 1
    out.phase = "Updating" if rolling else "ScalingDown"
    if desired == 0 and n == 1:
        # The last member has nobody to hand its segments to: a graceful leave could only wait out its
        # timeout. Scaling to 0 discards the (in-memory) data by definition; stop the pod promptly.
        (last,) = obs.active
        out.actions.append(DeletePod(last.name, "scaling to 0: the last member stops", grace_seconds=5))
        out.events.append(Event("Normal", "MemberStopped", f"stopping the last member {last.name} (scaling to 0)"))
        out.message = "scaling to 0: stopping the last member"
    elif not obs.well_formed or obs.rebalancing:
        out.message = "waiting for the group to agree on one view and the rebalance to finish before a leave"
    else:
        count = min(n - desired, s.spec.max_leaving)
        leavers = choose_leavers(obs.active, count, spec_hash, obs.coordinator_pod)
        for p in leavers:
            why = "runs an old spec (rolling update)" if p.spec_hash != spec_hash else f"scaling down to {desired}"
            out.actions.append(RequestLeave(p.name, why))
            out.events.append(Event("Normal", "MemberLeaving", f"asking member {p.name} to leave gracefully: {why}"))
        out.message = f"asking {', '.join(p.name for p in leavers)} to leave: {n} -> {desired} members"


def _surge_for_new_spec(s: _Step) -> None:
    """Rule 6: once the group is stable, add one member on the new spec."""
    out = s.out
    out.phase = "Updating"
    if not s.obs.well_formed or s.obs.rebalancing:
        out.message = "rolling update: waiting for the group to settle before the next member"
    else:
        ordinal = free_ordinal(s.pods)
        reason = f"rolling update: {len(s.outdated)} member(s) on an old spec"
        out.actions.append(CreatePod(ordinal, reason, _initial_cluster_size(s.ready)))
        out.events.append(Event("Normal", "MemberCreated", f"creating member pod {s.spec.name}-{ordinal} ({reason})"))
        out.message = reason


def _steady(s: _Step) -> None:
    """Nothing to do: the phase says what the cluster is (stopped, rebalancing, split, or running)."""
    obs, out = s.obs, s.out
    if s.desired == 0 and not [p for p in s.pods if not p.finished]:
        out.phase, out.message = "Stopped", "no members (replicas 0)"
    elif obs.rebalancing:
        out.phase, out.message = "Rebalancing", "the grid is moving segments"
    elif not obs.well_formed:
        out.phase, out.message = "Degraded", "the members do not agree on one view"
    else:
        out.phase, out.message = "Running", f"{s.n} member(s) in view {obs.view_id}"


def _back_off(s: _Step) -> None:
    """Rule 1's pacing: while the back-off runs, the step creates no pod."""
    # The back-off after exits in a row: no new pod until it ends (the failed pods stay until then too).
    out, fail = s.out, s.fail
    wait = fail.wait_seconds(s.now)
    if wait and any(isinstance(a, CreatePod) for a in out.actions):
        out.actions = [a for a in out.actions if not isinstance(a, CreatePod)]
        out.events = [e for e in out.events if e.reason != "MemberCreated"]
        out.phase = "Failing"
        out.message = (
            f"{fail.count} member exits in a row, the last {fail.last_pod}: {fail.last_reason}; "
            f"next attempt in {wait} s"
        )


def _degraded(s: _Step, auth_problem: str | None) -> tuple[list[str], str]:
    """Apply the guards and the degraded grid to the phase and events; returns the Degraded reasons and reason."""
    spec, obs, out = s.spec, s.obs, s.out
    blocked = _guards(spec, obs, out, auth_problem)
    degraded = blocked + obs.degraded_reasons
    grid_text = _grid_degraded_text(spec, obs.grid_degraded) if obs.grid_degraded is not None else ""
    if grid_text:
        degraded.append(grid_text)
        if s.waiting_join:
            # Not "waiting to join": a joiner gets no data from a degraded grid; the reason above says why.
            out.message = ""
    if degraded:
        out.phase = "Degraded"
        out.message = "; ".join(degraded) + (f"; {out.message}" if out.message else "")
    reason = "MembersUnavailable"
    if auth_problem:
        reason = "AuthSecretInvalid"
    elif blocked:
        reason = "AuthSettingsDiffer"
    elif grid_text:
        reason = "GridDegraded"
    before = s.prev.get("Degraded") or {}
    if blocked:
        # One Warning per new problem, not one per reconciliation (every few seconds).
        if before.get("status") != "True" or before.get("message") != "; ".join(degraded):
            out.events.append(Event("Warning", reason, "; ".join(blocked)))
    elif grid_text and (before.get("reason") != "GridDegraded" or grid_text not in str(before.get("message") or "")):
        out.events.append(Event("Warning", "GridDegraded", grid_text))
    return degraded, reason


def _guards(spec: ClusterSpec, obs: _Observed, out: Plan, auth_problem: str | None) -> list[str]:
    """Drop the actions the guards forbid (module docstring); returns why, for the Degraded condition."""
    blocked: list[str] = []
    forbidden: tuple[type, ...] = ()
    if auth_problem:
        blocked.append(auth_problem + "; no member is created, replaced or asked to leave until it is fixed")
        forbidden = (CreatePod, RequestLeave)
    running = sorted({p.auth_mode for p in obs.active + obs.leaving if p.auth_mode is not None} - {spec.auth.mode})
    if running and any(isinstance(a, CreatePod) for a in out.actions):
        blocked.append(
            f"spec.auth asks for frame authentication {spec.auth.mode!r} but members run {', '.join(running)}: "
            "members that differ cannot read each other's frames, so no member is added; revert spec.auth, or "
            "scale to 0 and back up to apply it (the in-memory data is discarded)"
        )
        forbidden = (*forbidden, CreatePod)
    if forbidden:
        out.actions = [a for a in out.actions if not isinstance(a, forbidden)]
        # Their events announced steps that will not happen now (each reason goes with one kind of action).
        gone = {"MemberCreated"} | ({"MemberLeaving"} if RequestLeave in forbidden else set())
        out.events = [e for e in out.events if e.reason not in gone]
    return blocked


def _condition(
    type_: str, on: bool, reason: str, message: str, previous: Mapping[str, Mapping[str, Any]], now: str
) -> dict[str, Any]:
    status = "True" if on else "False"
    before = previous.get(type_)
    # lastTransitionTime moves only when the status flips (Kubernetes' convention for conditions).
    since = before.get("lastTransitionTime") if before and before.get("status") == status else None
    cond = {"type": type_, "status": status, "reason": reason, "message": message}
    if since or now:
        cond["lastTransitionTime"] = since or now
    return cond


def ready_condition(phase: str, message: str, previous: Mapping[str, Mapping[str, Any]], now: str) -> dict[str, Any]:
    """``Ready``: True only in phase Running (every replica a ready member of one view, the grid available and
    balanced, nothing to do); otherwise its reason is the phase (``MemberFailing`` for Failing, ``InvalidSpec``
    for Invalid) and its message the status message. What ``kubectl wait --for=condition=Ready`` waits for."""
    if phase == "Running":
        return _condition("Ready", True, "AllMembersReady", message, previous, now)
    reason = {"Failing": "MemberFailing", "Invalid": "InvalidSpec"}.get(phase, phase)
    return _condition("Ready", False, reason, message, previous, now)


def invalid_status(message: str, previous_conditions: Sequence[Mapping[str, Any]], now: str) -> dict[str, Any]:
    """The status of a GroupCluster whose spec the operator cannot use: phase Invalid, Ready False, the rest
    of the conditions as they were (nothing is done, so nothing they say changed)."""
    prev = {str(c.get("type")): c for c in previous_conditions if isinstance(c, Mapping)}
    ready = ready_condition("Invalid", message, prev, now)
    others = [dict(c) for c in previous_conditions if isinstance(c, Mapping) and c.get("type") != "Ready"]
    return {"phase": "Invalid", "message": message, "conditions": [ready, *others]}


def _status(
    spec: ClusterSpec,
    spec_hash: str,
    pods: Sequence[PodState],
    reports: Mapping[str, MemberReport | None],
    obs: _Observed,
    ready: list[PodState],
    out: Plan,
    prev: Mapping[str, Mapping[str, Any]],
    now: str,
    degraded: list[str],
    degraded_reason: str,
    failures: Failures,
    deleted_by_others: set[str],
    going: set[str],
    pending: list[str],
) -> dict[str, Any]:
    n = len(obs.active)
    members = []
    for p in sorted(pods, key=lambda p: p.ordinal):
        if p.finished:
            continue
        r = reports.get(p.name)
        members.append(
            {
                "pod": p.name,
                "address": r.address if r else "",
                "ready": _member_ready(p, reports),
                "leaving": p.leave_requested or p.deleting or p.name in going,
                # Deleted by someone else (kubectl delete pod, a drain): its replacement says so.
                "deleted": p.name in deleted_by_others,
                "viewId": (r.view_id or "") if r else "",
                "segmentsOwned": r.segments_owned if r else 0,
                "entries": r.entries if r else 0,
                "maxEntries": r.max_entries if r else 0,
                "bytes": r.nbytes if r else 0,
                "maxBytes": r.max_bytes if r else 0,
                "upToDate": p.spec_hash == spec_hash,
            }
        )
    joined = [r for r in reports.values() if r is not None and r.joined]
    topo = {r.topology_id for r in joined if r.topology_id is not None}
    # Members at their max_entries bound refuse PUTs of new keys (HTTP 507), and members within 1% of their
    # max_bytes bound most PUTs that grow them: more members, or a higher bound, make room (docs/grid.md, "A bound
    # on entries").
    full = []
    for p in sorted(pods, key=lambda p: p.ordinal):
        r = reports.get(p.name)
        if p.finished or r is None:
            continue
        if 0 < r.max_entries <= r.entries:
            full.append(f"{p.name} holds {r.entries} of {r.max_entries} entries")
        if r.max_bytes and r.nbytes * 100 >= r.max_bytes * 99:
            full.append(f"{p.name} holds {r.nbytes} of {r.max_bytes} bytes")
    scaling_up = any(isinstance(a, CreatePod) for a in out.actions) or (n < spec.replicas)
    scaling_down = bool(obs.leaving) or n > spec.replicas
    view_size = len(obs.active) + len(obs.leaving) if obs.well_formed else 0
    conditions = [
        ready_condition(out.phase, out.message, prev, now),
        _condition(
            "WellFormed",
            obs.well_formed,
            "OneView" if obs.well_formed else "ViewsDiffer",
            f"every member reports view {obs.view_id}" if obs.well_formed else "the members do not all report one view",
            prev,
            now,
        ),
        _condition(
            "Rebalancing",
            obs.rebalancing,
            "SegmentsMoving" if obs.rebalancing else "Balanced",
            "segments are being transferred" if obs.rebalancing else "no rebalance in progress",
            prev,
            now,
        ),
        _condition(
            "ScalingUp",
            scaling_up,
            "AddingMembers" if scaling_up else "Idle",
            f"{n} of {spec.replicas} members" if scaling_up else "",
            prev,
            now,
        ),
        _condition(
            "ScalingDown",
            scaling_down,
            "RemovingMembers" if scaling_down else "Idle",
            f"{n + len(obs.leaving)} members, {spec.replicas} wanted" if scaling_down else "",
            prev,
            now,
        ),
        _condition(
            "Degraded",
            bool(degraded),
            degraded_reason if degraded else "Healthy",
            "; ".join(degraded),
            prev,
            now,
        ),
        _condition(
            "Full",
            bool(full),
            "AtMaxEntries" if full else "Room",
            "; ".join(full) + ": PUTs of new keys are refused (scale up or raise spec.grid.max_entries or max_bytes)"
            if full
            else "",
            prev,
            now,
        ),
    ]
    return {
        "phase": out.phase,
        "message": out.message,
        "replicas": n,
        "readyReplicas": len(ready),
        "ready": f"{len(ready)}/{spec.replicas}",
        "selector": spec.selector,
        "viewId": obs.view_id or "",
        "view": _short_view(obs.view_id, view_size, obs.pod_of),
        "coordinator": obs.coordinator_pod or "",
        "members": members,
        "rebalance": {
            "inProgress": obs.rebalancing,
            "segmentsToFetch": sum(r.segments_to_fetch for r in joined),
            "segmentsFetched": sum(r.segments_fetched for r in joined),
            "topologyId": max(topo) if topo else 0,
        },
        "failures": failures.to_status(),
        "pendingReplacements": pending,
        "specHash": spec_hash,
        "conditions": conditions,
    }
