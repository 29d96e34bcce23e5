"""The pure scaling planner: from the spec, the pods and what the members report, the next step.

:func:`plan` is called on every reconciliation (a kopf timer) with what the handler observed; it returns a
:class:`Plan`: the actions to execute now (create a pod, ask a member to leave, delete a pod), or none (wait),
the status to write and the events to post. It keeps no state: everything it needs to remember (a leave was
asked for, which spec a pod runs) lives on the pods as annotations, so an operator restart picks up where the
last one stopped.

The rules, in the order they are checked:

1. A member pod that finished (it left, or its process died) is deleted; one that died unexpectedly is
   reported as a Warning event, and the steps below replace it.
2. While any member is leaving (a leave was asked for) or any pod is terminating, nothing else starts: the
   leave must finish first (its data handed off). A leaving member that says it is not leaving (the request
   was lost) is asked again.
3. While a pod is starting (not ready: not joined yet, or its state transfer not finished), wait. A new
   member counts as ready only then, so pods are added one at a time. One exception: a join-only member (see
   below) that is the only pod left and reports no grid topology can never start: it is deleted, and rule 4
   then creates a cluster's first member in its place.
4. Fewer members than wanted: create one (the lowest free ordinal).
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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .model import (
    AUTH_MODE_ANNOTATION,
    INITIAL_SIZE_ANNOTATION,
    LEAVE_ANNOTATION,
    ORDINAL_LABEL,
    SPEC_HASH_ANNOTATION,
    ClusterSpec,
)


# -- inputs ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PodState:
    """One member pod as the API server shows it."""

    name: str
    ordinal: int
    phase: str = "Pending"  # Pending | Running | Succeeded | Failed | Unknown
    ip: str | None = None
    ready: bool = False  # the pod's Ready condition (readiness probe /readyz)
    deleting: bool = False  # deletionTimestamp is set
    spec_hash: str = ""
    leave_requested: bool = False
    exit_code: int | None = None
    reason: str = ""  # the container's termination reason, e.g. OOMKilled, Error
    auth_mode: str | None = None  # off | mac | aead (the pod's annotation); None: unknown
    initial_cluster_size: int = 1  # the grid's initial_cluster_size its member started with (the annotation)

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed") and not self.deleting

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodState:
        """Read a Pod object from the API server."""
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        try:
            ordinal = int(labels.get(ORDINAL_LABEL, ""))
        except ValueError:
            ordinal = -1  # not one of ours by name; it still counts, and never blocks an ordinal
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or () if c)
        try:
            # A pod made before the annotation existed started its member with the grid's default, 1.
            initial_size = max(1, int(annotations.get(INITIAL_SIZE_ANNOTATION, "1")))
        except ValueError:
            initial_size = 1
        exit_code, reason = None, ""
        for cs in status.get("containerStatuses") or ():
            term = ((cs or {}).get("state") or {}).get("terminated")
            if term:
                exit_code, reason = term.get("exitCode"), term.get("reason") or ""
        return cls(
            name=str(meta.get("name")),
            ordinal=ordinal,
            phase=str(status.get("phase") or "Pending"),
            ip=status.get("podIP") or None,
            ready=ready,
            deleting=bool(meta.get("deletionTimestamp")),
            spec_hash=str(annotations.get(SPEC_HASH_ANNOTATION, "")),
            leave_requested=LEAVE_ANNOTATION in annotations,
            exit_code=exit_code,
            reason=reason,
            # A pod of ours without the annotation was made by an operator that predates spec.auth: no auth.
            auth_mode=annotations.get(AUTH_MODE_ANNOTATION) or ("off" if SPEC_HASH_ANNOTATION in annotations else None),
            initial_cluster_size=initial_size,
        )


@dataclass(frozen=True)
class MemberReport:
    """What a member's ``GET /v1/status`` said (None in the reports map when it did not answer)."""

    address: str
    joined: bool = True
    view_id: str | None = None
    view_members: tuple[str, ...] = ()
    coordinator: str | None = None
    grid_phase: str | None = "NO_REBALANCE"
    availability: str | None = "AVAILABLE"
    leaving: bool = False
    grid_ready: bool = True
    segments_owned: int = 0
    segments_to_fetch: int = 0
    segments_fetched: int = 0
    topology_id: int | None = None
    entries: int = 0  # live entries the member holds
    max_entries: int = 0  # its max_entries bound (spec.grid.max_entries; 0: none)
    nbytes: int = 0  # key and value bytes of its live entries
    max_bytes: int = 0  # its max_bytes bound (spec.grid.max_bytes; 0: none)

    @classmethod
    def from_status(cls, body: Mapping[str, Any]) -> MemberReport:
        """Parse a ``/v1/status`` answer (the shape of :mod:`groupcluster.grid.http_api`)."""
        view = body.get("view") or {}
        grid = body.get("grid") or {}
        rebalance = grid.get("rebalance") or {}
        store = grid.get("store") or {}
        vid = view.get("id")
        view_id = f"{vid[1]}|{vid[0]}" if isinstance(vid, list) and len(vid) == 2 else None
        return cls(
            address=str(body.get("address") or ""),
            joined=bool(body.get("joined")),
            view_id=view_id,
            view_members=tuple(str(m) for m in view.get("members") or ()),
            coordinator=body.get("coordinator"),
            grid_phase=grid.get("phase"),
            availability=grid.get("availability"),
            leaving=bool(grid.get("leaving")),
            grid_ready=bool(grid.get("ready")),
            segments_owned=int(grid.get("segments_owned") or 0),
            segments_to_fetch=int(rebalance.get("segments_to_fetch") or 0),
            segments_fetched=int(rebalance.get("segments_fetched") or 0),
            topology_id=grid.get("topology_id"),
            entries=int(store.get("entries") or 0),
            max_entries=int(store.get("max_entries") or 0),
            nbytes=int(store.get("bytes") or 0),
            max_bytes=int(store.get("max_bytes") or 0),
        )


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
    degraded_reasons: list[str]
    coordinator_pod: str | None


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
    for r in joined.values():
        if r.availability not in (None, "AVAILABLE"):
            degraded.append(f"the grid is {r.availability} (a partition may have lost owners)")
            break
    coordinators = {r.coordinator for r in joined.values() if r.coordinator}
    by_address = {r.address: n for n, r in joined.items()}
    coordinator_pod = by_address.get(next(iter(coordinators))) if len(coordinators) == 1 else None
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


def _stranded_joiner(
    pods: Sequence[PodState], obs: _Observed, reports: Mapping[str, MemberReport | None]
) -> PodState | None:
    """A join-only member that can never start: the only pod left, and it says it holds no grid topology.

    It would need ``initial_cluster_size`` members without a topology, and the planner adds no pod while one
    is starting: without this it would wait forever. It must say so itself (answer with no topology): one that
    does not answer may hold the last copies (it joined, then everybody else died), and is left alone.
    """
    if len(pods) != 1 or len(obs.active) != 1:
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


def plan(
    spec: ClusterSpec,
    pods: Sequence[PodState],
    reports: Mapping[str, MemberReport | None],
    *,
    spec_hash: str | None = None,
    previous_conditions: Sequence[Mapping[str, Any]] = (),
    now: str = "",
    auth_problem: str | None = None,
) -> Plan:
    """The next step for one GroupCluster (see the module docstring for the rules and the guards)."""
    spec_hash = spec_hash or spec.pod_hash()
    obs = _observe(pods, reports)
    out = Plan()
    desired = spec.replicas

    # 1. finished pods: delete (and say why they finished).
    for p in obs.finished:
        if p.leave_requested and p.phase == "Succeeded":
            out.actions.append(DeletePod(p.name, "left the group after handing its data off"))
            out.events.append(Event("Normal", "MemberLeft", f"member {p.name} left the group; deleting its pod"))
        else:
            how = f"exit code {p.exit_code}" if p.exit_code is not None else p.phase.lower()
            why = f" ({p.reason})" if p.reason else ""
            out.actions.append(DeletePod(p.name, f"member exited unexpectedly: {how}{why}"))
            out.events.append(
                Event("Warning", "MemberDied", f"member {p.name} exited unexpectedly ({how}{why}); replacing it")
            )

    ready = [p for p in obs.active if _member_ready(p, reports)]
    starting = [p for p in obs.active if not _member_ready(p, reports)]
    outdated = [p for p in obs.active if p.spec_hash != spec_hash]
    n = len(obs.active)

    # 2. leaves and terminations in progress: let them finish.
    if obs.leaving or obs.terminating:
        for p in obs.leaving:
            r = reports.get(p.name)
            if r is not None and r.joined and not r.leaving:
                out.actions.append(RequestLeave(p.name, "a leave was asked for but the member is not leaving"))
        names = ", ".join(p.name for p in obs.leaving + obs.terminating)
        out.message = f"waiting for {names} to leave"
        out.phase = "ScalingDown" if n >= desired or obs.leaving else "ScalingUp"
    # 3. starting pods: one join at a time (a stranded join-only member is replaced by a first member).
    elif stranded := _stranded_joiner(pods, obs, reports):
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
    elif starting:
        out.message = f"waiting for {', '.join(p.name for p in starting)} to join and receive its data"
        out.phase = "ScalingUp" if n <= desired else "ScalingDown"
    # 4. too few members: add one.
    elif n < desired:
        ordinal = free_ordinal(pods)
        reason = f"scaling up: {n} of {desired} members"
        if obs.finished and any(not (p.leave_requested and p.phase == "Succeeded") for p in obs.finished):
            reason = f"replacing a member that died: {n} of {desired} members"
        out.actions.append(CreatePod(ordinal, reason, _initial_cluster_size(ready)))
        out.events.append(Event("Normal", "MemberCreated", f"creating member pod {spec.name}-{ordinal} ({reason})"))
        out.phase, out.message = "ScalingUp", reason
    # 5. too many members: graceful leaves, bounded by numOwners-1, once the grid is settled.
    elif n > desired:
        rolling = bool(outdated) and n == desired + 1
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
            count = min(n - desired, spec.max_leaving)
            for p in choose_leavers(obs.active, count, spec_hash, obs.coordinator_pod):
                why = "runs an old spec (rolling update)" if p.spec_hash != spec_hash else f"scaling down to {desired}"
                out.actions.append(RequestLeave(p.name, why))
                out.events.append(
                    Event("Normal", "MemberLeaving", f"asking member {p.name} to leave gracefully: {why}")
                )
            out.message = f"{len(out.actions)} member(s) leaving: {n} -> {desired}"
    # 6. the right number but an old spec: surge one new member (rule 5 then retires an old one).
    elif outdated and desired > 0:
        out.phase = "Updating"
        if not obs.well_formed or obs.rebalancing:
            out.message = "rolling update: waiting for the group to settle before the next member"
        else:
            ordinal = free_ordinal(pods)
            reason = f"rolling update: {len(outdated)} member(s) on an old spec"
            out.actions.append(CreatePod(ordinal, reason, _initial_cluster_size(ready)))
            out.events.append(Event("Normal", "MemberCreated", f"creating member pod {spec.name}-{ordinal} ({reason})"))
            out.message = reason
    else:
        if desired == 0 and not pods:
            out.phase, out.message = "Stopped", "no members (replicas 0)"
        elif obs.rebalancing:
            out.phase, out.message = "Rebalancing", "the grid is moving segments"
        elif not obs.well_formed:
            out.phase, out.message = "Degraded", "the members do not agree on one view"
        else:
            out.phase, out.message = "Running", f"{n} member(s) in view {obs.view_id}"

    blocked = _guards(spec, obs, out, auth_problem)
    degraded = blocked + obs.degraded_reasons
    if degraded:
        out.phase = "Degraded"
        out.message = "; ".join(degraded) + (f"; {out.message}" if out.message else "")
    reason = "MembersUnavailable"
    if auth_problem:
        reason = "AuthSecretInvalid"
    elif blocked:
        reason = "AuthSettingsDiffer"
    if blocked:
        # One Warning per new problem, not one per reconciliation (every few seconds).
        before = next((c for c in previous_conditions if isinstance(c, Mapping) and c.get("type") == "Degraded"), {})
        if before.get("status") != "True" or before.get("message") != "; ".join(degraded):
            out.events.append(Event("Warning", reason, "; ".join(blocked)))
    out.status = _status(spec, spec_hash, pods, reports, obs, ready, out, previous_conditions, now, degraded, reason)
    return out


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


def _status(
    spec: ClusterSpec,
    spec_hash: str,
    pods: Sequence[PodState],
    reports: Mapping[str, MemberReport | None],
    obs: _Observed,
    ready: list[PodState],
    out: Plan,
    previous_conditions: Sequence[Mapping[str, Any]],
    now: str,
    degraded: list[str],
    degraded_reason: str,
) -> dict[str, Any]:
    prev = {str(c.get("type")): c for c in previous_conditions if isinstance(c, Mapping)}
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
                "leaving": p.leave_requested or p.deleting,
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
    conditions = [
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
        "selector": spec.selector,
        "viewId": obs.view_id or "",
        "coordinator": obs.coordinator_pod or "",
        "members": members,
        "rebalance": {
            "inProgress": obs.rebalancing,
            "segmentsToFetch": sum(r.segments_to_fetch for r in joined),
            "segmentsFetched": sum(r.segments_fetched for r in joined),
            "topologyId": max(topo) if topo else 0,
        },
        "specHash": spec_hash,
        "conditions": conditions,
    }
