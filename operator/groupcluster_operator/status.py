"""The GroupCluster status a planning step writes: its fields, its conditions, and the words for a degraded grid."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .actions import CreatePod, Plan
from .failures import Failures
from .membership import Observed, member_ready
from .model import ClusterSpec
from .observations import MemberReport, PodState


def grid_degraded_text(spec: ClusterSpec, r: MemberReport) -> str:
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


def build_status(
    spec: ClusterSpec,
    spec_hash: str,
    pods: Sequence[PodState],
    reports: Mapping[str, MemberReport | None],
    obs: Observed,
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
                "ready": member_ready(p, reports),
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
