"""What the scaling planner observes: a member pod as the API server shows it (:class:`PodState`) and a
member's report of its own state from its HTTP status (:class:`MemberReport`).

Both are read from documents the operator does not control (a pod object, a member's ``/v1/status`` JSON),
so a missing or odd field gives a safe default rather than an error; :mod:`groupcluster_operator.planner`
decides on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .model import (
    AUTH_MODE_ANNOTATION,
    INITIAL_SIZE_ANNOTATION,
    LEAVE_ANNOTATION,
    ORDINAL_LABEL,
    SPEC_HASH_ANNOTATION,
    STOP_ANNOTATION,
)

# Container waiting reasons that will not go away by waiting (the kubelet retries pulls on its own, but the
# spec must change): the planner reports them instead of "waiting to join".
STUCK_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
        "PreStartHookError",
        "PostStartHookError",
    }
)  # Status and event texts quote pods' messages: keep them to a line.
MAX_TEXT = 300


def _brief(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


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
    stopped_by_operator: bool = False  # the operator deleted it (not a leave, not someone else)
    exit_code: int | None = None
    reason: str = ""  # the container's termination reason, e.g. OOMKilled, Error
    auth_mode: str | None = None  # off | mac | aead (the pod's annotation); None: unknown
    initial_cluster_size: int = 1  # the grid's initial_cluster_size its member started with (the annotation)
    message: str = ""  # the container's termination message (the end of its log: FallbackToLogsOnError)
    waiting_reason: str = ""  # why the container is not running yet, e.g. ContainerCreating, ImagePullBackOff
    waiting_message: str = ""
    unschedulable: str = ""  # the scheduler's message while the pod cannot be placed on a node

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed") and not self.deleting

    @property
    def stuck(self) -> str:
        """Why this pod cannot start (empty while it is merely starting): a pull error, a config error, ..."""
        if self.finished or self.deleting:
            return ""
        if self.waiting_reason in STUCK_REASONS:
            detail = f": {self.waiting_message}" if self.waiting_message else ""
            return _brief(f"{self.waiting_reason}{detail}")
        if self.unschedulable:
            return _brief(f"Unschedulable: {self.unschedulable}")
        return ""

    @property
    def exit_text(self) -> str:
        """How the member ended, e.g. ``exit code 1 (Error): ValueError: ...`` (the last line of its message)."""
        how = f"exit code {self.exit_code}" if self.exit_code is not None else self.phase.lower()
        why = f" ({self.reason})" if self.reason else ""
        lines = [line.strip() for line in self.message.splitlines() if line.strip()]
        return _brief(f"{how}{why}: {lines[-1]}" if lines else f"{how}{why}")

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
        exit_code, reason, message, waiting_reason, waiting_message = None, "", "", "", ""
        for cs in status.get("containerStatuses") or ():
            state = (cs or {}).get("state") or {}
            term = state.get("terminated")
            if term:
                exit_code, reason, message = term.get("exitCode"), term.get("reason") or "", term.get("message") or ""
            waiting = state.get("waiting")
            if waiting:
                waiting_reason, waiting_message = waiting.get("reason") or "", waiting.get("message") or ""
        unschedulable = ""
        for c in status.get("conditions") or ():
            if c and (c.get("type"), c.get("status"), c.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
                unschedulable = c.get("message") or "no node can take the pod"
        return cls(
            name=str(meta.get("name")),
            ordinal=ordinal,
            phase=str(status.get("phase") or "Pending"),
            ip=status.get("podIP") or None,
            ready=ready,
            deleting=bool(meta.get("deletionTimestamp")),
            spec_hash=str(annotations.get(SPEC_HASH_ANNOTATION, "")),
            leave_requested=LEAVE_ANNOTATION in annotations,
            stopped_by_operator=STOP_ANNOTATION in annotations,
            exit_code=exit_code,
            reason=reason,
            # A pod of ours without the annotation was made by an operator that predates spec.auth: no auth.
            auth_mode=annotations.get(AUTH_MODE_ANNOTATION) or ("off" if SPEC_HASH_ANNOTATION in annotations else None),
            initial_cluster_size=initial_size,
            message=str(message),
            waiting_reason=str(waiting_reason),
            waiting_message=str(waiting_message),
            unschedulable=str(unschedulable),
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
    num_segments: int = 0  # segments of its topology (0: no routing table)
    segments_unavailable: int = 0  # segments of its topology with no owner among the live members

    @classmethod
    def from_status(cls, body: Mapping[str, Any]) -> MemberReport:
        """Parse a ``/v1/status`` answer (the shape of :mod:`groupcluster.grid.http.app`)."""
        view = body.get("view") or {}
        grid = body.get("grid") or {}
        rebalance = grid.get("rebalance") or {}
        store = grid.get("store") or {}
        vid = view.get("id")
        view_id = f"{vid[1]}|{vid[0]}" if isinstance(vid, list) and len(vid) == 2 else None
        # The routing table lists, per segment, the owners among the topology's members (the live ones): an
        # empty list is a segment nobody can serve (a degraded grid that lost every copy of it).
        routing = body.get("routing") or {}
        owners = routing.get("owners") if isinstance(routing, Mapping) else None
        owners = owners if isinstance(owners, list) else []
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
            num_segments=int(routing.get("num_segments") or len(owners)) if owners else 0,
            segments_unavailable=sum(1 for o in owners if not o),
        )
