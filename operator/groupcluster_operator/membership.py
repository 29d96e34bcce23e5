"""What one planning step sees of the members, and the choices that follow from it alone.

:func:`observe` sorts the pods by state (active, leaving, terminating, finished) and reads the members' reports:
whether they form one well-formed view, whether the grid rebalances or is degraded, who coordinates. The rest
picks from that: which member is ready, who leaves first, the next free ordinal, a new member's grid
``initial_cluster_size``, a join-only member that can never start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .observations import MemberReport, PodState


@dataclass(frozen=True)
class Observed:
    """The pods of one step by state, and what their members' reports say together."""

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


def observe(pods: Sequence[PodState], reports: Mapping[str, MemberReport | None]) -> Observed:
    """Sort the pods by state and read the reports of the live members (``None``: it did not answer)."""
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
    return Observed(
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


def member_ready(p: PodState, reports: Mapping[str, MemberReport | None]) -> bool:
    """Ready as the planner counts it: the pod's probe passes and its member joined with its data, not leaving."""
    r = reports.get(p.name)
    return p.ready and r is not None and r.joined and r.grid_ready and not r.leaving


def initial_cluster_size_for(ready: Sequence[PodState]) -> int:
    """A new member's grid ``initial_cluster_size``: join-only (k+1) while k members are ready, else 1.

    Every ready member holds a grid topology (``/readyz``), so with k+1 the new member can only join theirs:
    a new grid would need k+1 members without one, i.e. the whole old cluster gone. With none ready it is the
    cluster's first member and must start the grid alone (the next pod is created only once it is ready).
    """
    return len(ready) + 1


def stranded_joiner(obs: Observed, reports: Mapping[str, MemberReport | None]) -> PodState | None:
    """A join-only member that can never start: the only member left, and it says it holds no grid topology.

    It would need ``initial_cluster_size`` members without a topology, and the planner adds no pod while one
    is starting: without this it would wait forever. It must say so itself (answer with no topology): one that
    does not answer may hold the last copies (it joined, then everybody else died), and is left alone.
    """
    if len(obs.active) != 1 or obs.leaving or obs.terminating:
        return None
    (p,) = obs.active
    r = reports.get(p.name)
    if p.initial_cluster_size <= 1 or member_ready(p, reports) or r is None or r.topology_id is not None:
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
    """The lowest ordinal no pod has (a new pod's name is ``NAME-<ordinal>``)."""
    used = {p.ordinal for p in pods}
    n = 0
    while n in used:
        n += 1
    return n
