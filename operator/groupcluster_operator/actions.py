"""What a planning step returns: the actions to execute, the events to post, and the :class:`Plan` carrying them.

The handler executes the actions in order (create a pod, ask a member to leave, delete a pod), posts the events
on the GroupCluster and writes the plan's status; :mod:`groupcluster_operator.planner` decides them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
