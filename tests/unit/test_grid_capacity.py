"""Changing a running member's capacity (docs/grid.md, "Capacity"): ``GridNode.set_capacity`` reaches the
coordinator in the member's STATUS and the next rebalance gives the member its new share of the segments, none
at 0, while every key stays readable with all its copies. In-memory nodes on the fake network of gridnet.py."""

from __future__ import annotations

import random

import pytest
from groupcluster.grid.consistent_hash import segment_of
from groupcluster.grid.topology import Phase

from .gridnet import FakeNet

KEYS = [b"key-%d" % i for i in range(300)]


def _grid(members: int = 3) -> FakeNet:
    net = FakeNet(random.Random(11))
    net.add(members)
    net.run_until(3.0)
    assert net.stable()
    a = net.view[0]
    for k in KEYS:
        net.nodes[a].put(k, b"v-" + k, net.now)
    net.collect(a)
    net.run_until(net.now + 2.0)
    assert all(r.ok for r in net.results[a])
    return net


def _owned(net: FakeNet, i: int) -> int:
    t = net.coordinator.topology
    assert t is not None
    return len(t.current.segments_owned(net.view[i]))


def _every_copy_holds_every_key(net: FakeNet) -> None:
    t = net.coordinator.topology
    assert t is not None
    for k in KEYS:
        seg = segment_of(k, t.num_segments)
        for m in t.current.owners_of(seg):
            entry = net.nodes[m].store.get(seg, k)  # type: ignore[union-attr]
            assert entry is not None and entry[1] == b"v-" + k, (k, m)


def _set(net: FakeNet, i: int, capacity: float, *, owners: int = 2) -> None:
    """Set member i's capacity and let the grid settle: one topology everywhere, no rebalance, each segment with
    ``owners`` owners (fewer than num_owners when fewer members have capacity)."""
    a = net.view[i]
    net.nodes[a].set_capacity(capacity, net.now)
    net.collect(a)
    net.run_until(net.now + 4.0)
    t = net.coordinator.topology
    assert t is not None and t.phase == Phase.NO_REBALANCE
    assert all(net.nodes[m].topology.topology_id == t.topology_id for m in net.view)  # type: ignore[union-attr]
    assert {len(o) for o in t.current.owners} == {owners}


def test_capacity_zero_moves_every_segment_away_and_back_at_one() -> None:
    net = _grid()
    assert _owned(net, 2) > 0
    _set(net, 2, 0)
    assert _owned(net, 2) == 0 and net.view[2] in net.coordinator.topology.members  # type: ignore[union-attr]
    assert len(net.nodes[net.view[2]].store) == 0  # type: ignore[arg-type]
    _every_copy_holds_every_key(net)
    assert net.nodes[net.view[2]].status()["capacity"] == 0.0
    _set(net, 2, 1)
    assert _owned(net, 2) > 0
    _every_copy_holds_every_key(net)


def test_a_larger_capacity_takes_a_larger_share() -> None:
    net = _grid()
    t = net.coordinator.topology
    assert t is not None
    before = [len(t.current.segments_primary(m)) for m in net.view]
    _set(net, 0, 3)
    t = net.coordinator.topology
    assert t is not None
    after = [len(t.current.segments_primary(m)) for m in net.view]
    # 3/5 of the 32 primaries (about 19) instead of a third; and a copy of every segment.
    assert after[0] > before[0] and after[0] >= 18 and _owned(net, 0) == 32, (before, after)
    _every_copy_holds_every_key(net)


def test_fewer_members_with_capacity_than_owners_keep_one_copy_and_all_at_zero_move_nothing() -> None:
    net = _grid()
    _set(net, 0, 0)
    _set(net, 1, 0, owners=1)  # one member with capacity: one copy of each segment, as in a grid of one
    assert [_owned(net, i) for i in range(3)] == [0, 0, 32]
    _every_copy_holds_every_key(net)
    tid = net.coordinator.topology.topology_id  # type: ignore[union-attr]
    _set(net, 2, 0, owners=1)  # nobody with capacity: somebody must keep the data, so nothing moves
    assert [_owned(net, i) for i in range(3)] == [0, 0, 32]
    assert net.coordinator.topology.topology_id == tid  # type: ignore[union-attr]
    _every_copy_holds_every_key(net)
    _set(net, 0, 1, owners=1)  # member 0 is the only one with capacity now: it takes every segment
    assert [_owned(net, i) for i in range(3)] == [32, 0, 0]
    _every_copy_holds_every_key(net)
    _set(net, 1, 1)  # two with capacity: two copies again
    _every_copy_holds_every_key(net)


@pytest.mark.parametrize("bad", [-1, 1_000_001, float("nan"), float("inf"), "1", True, None])
def test_a_bad_capacity_is_refused_and_changes_nothing(bad: object) -> None:
    net = _grid(2)
    node = net.nodes[net.view[0]]
    with pytest.raises(ValueError, match="capacity: expected a number from 0 to 1000000, got "):
        node.set_capacity(bad, net.now)  # type: ignore[arg-type]
    assert node.config.capacity == 1.0 and node.metrics["grid.capacity_changes"] == 0
