"""The simulated fault schedule's rule (sim/grid/run.py, GridRun._may_expose, shared by the grid and grid-tx runs):
at most num_owners - 1 members lost before rebalancing completes, counting the members message loss alone cut off,
which the schedule's own exposure count does not know of. Built by hand: topologies as members hold them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from groupcluster.core.address import Address
from groupcluster.grid.consistent_hash import ConsistentHash
from groupcluster.grid.topology import CacheTopology, PartitionHandling, Phase
from groupcluster.sim.grid.run import GridRun

SEGS = 4


def m(i: int) -> Address:
    return Address(f"10.0.0.{i}", 7800, i)


A, B, C, D = m(1), m(2), m(3), m(4)


def topology(tid: int, members: tuple[Address, ...], owners: list[tuple[Address, ...]], **kw: Any) -> CacheTopology:
    ch = ConsistentHash(
        SEGS, 2, members, (1.0,) * len(members), tuple(tuple(members.index(o) for o in own) for own in owners)
    )
    return CacheTopology(tid, 1, Phase.NO_REBALANCE, ch, None, members, mode=PartitionHandling.ALLOW_READS, **kw)


# Before the split: every segment on two of the four members.
WHOLE = topology(1, (A, B, C, D), [(B, D), (A, B), (C, A), (D, C)], stable_members=(A, B, C, D))
# Message loss cut D off: the other three dropped it (lost), still available, and segment 0 has one copy left, on B.
SPLIT = topology(2, (A, B, C), [(B,), (A, B), (C, A), (C,)], stable_members=(A, B, C, D), lost=(D,))


def run_state(topologies: dict[Address, CacheTopology], *, num_owners: int = 2) -> Any:
    """The parts of a GridRun that _may_expose reads: no fault scheduled yet (the exposure count is 0)."""
    apps = [SimpleNamespace(me=a, grid=SimpleNamespace(topology=t)) for a, t in topologies.items()]
    return SimpleNamespace(
        exposed=0,
        exposures=set(),
        setup=SimpleNamespace(num_owners=num_owners),
        sc=SimpleNamespace(capacity_changes=0.0),
        _apps=lambda: apps,
        _note_whole=lambda: False,
    )


def test_a_whole_grid_may_lose_one_member() -> None:
    state = run_state({A: WHOLE, B: WHOLE, C: WHOLE, D: WHOLE})
    assert GridRun._may_expose(state, 1)


def test_no_member_lost_while_message_loss_left_a_segment_with_one_copy() -> None:
    # Grid-tx seed 435111000144: D (10.0.0.5) was excluded by message loss alone, the others' topology kept
    # segment 18 on B (10.0.0.3) only, and the schedule, its exposure count at 0, crashed B: a committed
    # transaction's write of u1 was gone. D, cut off, still runs and still holds its older topology.
    state = run_state({A: SPLIT, B: SPLIT, C: SPLIT, D: WHOLE})
    assert not GridRun._may_expose(state, 1)
