"""The merge of two grids that never met: the later write of each key wins (grid simulation seed 553, grid-tx
seed 1450; docs/grid.md, "Grids that never met").

Two grids started apart both number their topologies from 1, so a version ``(topology id << 40) | seq`` says
nothing about which of their writes came last: before, the grid that had gone through more topologies won
every key. Now a sequence is at least its primary's wall clock in milliseconds, the planner of the merged
group sees two grid ids and keeps one topology id for re-stamping, and every member pushes what it held
under that id with its sequence (the write's time) kept. Built by hand over the fake network of
gridnet.py: grid A goes through a join (several topologies), grid B starts later with one member.
"""

from __future__ import annotations

import random

from groupcluster.grid.node import GridNode
from groupcluster.grid.store import MAX_SEQ, clock_seq, next_seq, version_seq, version_topology

from .gridnet import CONFIG, FakeNet

WALL = 1_800_000_000.0  # the wall clock at virtual time 0 (any date after the store's clock epoch)


def _grid(first: int, start: float, rng: random.Random, size: int, skew: float = 0.0) -> FakeNet:
    """A grid of ``size`` members with addresses from ``first``, the first started at ``start``, the others
    joining one by one (each join is a rebalance: several topologies)."""
    net = FakeNet(rng, CONFIG)
    net.now = start
    net.next_id = first
    for _ in range(size):
        (x,) = net.add(1)
        net.nodes[x].wall_offset = WALL + skew
        net.run_until(net.now + 2.0)
    assert net.stable()
    return net


def _put(net: FakeNet, at: float, key: bytes, value: bytes) -> None:
    net.run_until(at)
    x = net.view[-1]
    op = net.nodes[x].put(key, value, net.now)
    net.collect(x)
    net.run_until(net.now + 0.5)
    assert [r.ok for r in net.results[x] if r.op_id == op] == [True], (key, value)


def _merge(a: FakeNet, b: FakeNet) -> FakeNet:
    """b's members join a's group in one merge view; the merged group runs until it is stable."""
    assert not b.events or all(e[2] == "tick" for e in b.events)
    now = max(a.now, b.now) + 0.1
    a.run_until(now)
    a.nodes.update(b.nodes)
    a.view = a.view + b.view
    for x in a.view:
        a.nodes[x].on_view(tuple(a.view), now, merge=True)
    for x in a.view:
        a.collect(x)
    a.run_until(now + 15.0)
    assert a.stable()
    return a


def _values(net: FakeNet) -> dict[bytes, bytes]:
    """Every live key and its value, checking that every owner holding it (and only owners) agrees."""
    t = net.coordinator.topology
    assert t is not None
    held: dict[bytes, set[bytes]] = {}
    for x in net.view:
        store = net.nodes[x].store
        assert store is not None
        for s, k, _ver, v in store.items():
            assert x in t.current.owners_of(s), (x, k)
            held.setdefault(k, set()).add(v)
    assert all(len(vs) == 1 for vs in held.values()), held
    return {k: vs.pop() for k, vs in held.items()}


def _run(skew_b: float = 0.0) -> tuple[FakeNet, int, int]:
    a = _grid(1, 0.0, random.Random(11), 2)  # topologies 1.., a join: its ids pass B's
    b = _grid(10, 3.0, random.Random(12), 1, skew=skew_b)
    _put(a, 6.0, b"k1", b"a-early")
    _put(b, 7.0, b"k1", b"b-later")  # acknowledged after A's: must win although A's topology id is higher
    _put(b, 8.0, b"k2", b"b-earlier")
    _put(a, 9.0, b"k2", b"a-latest")  # and the other way round: the later write wins, not a whole grid
    _put(a, 9.5, b"only-a", b"a")
    _put(b, 9.5, b"only-b", b"b")
    ta, tb = a.coordinator.topology, b.coordinator.topology
    assert ta is not None and tb is not None and ta.topology_id > tb.topology_id and ta.grid_id != tb.grid_id
    return _merge(a, b), ta.topology_id, tb.topology_id


def test_the_merge_of_grids_that_never_met_keeps_the_later_write_of_each_key() -> None:
    net, ida, idb = _run()
    expected = {b"k1": b"b-later", b"k2": b"a-latest", b"only-a": b"a", b"only-b": b"b"}
    assert _values(net) == expected
    t = net.coordinator.topology
    assert t is not None and t.restamp > max(ida, idb) and t.topology_id > t.restamp
    # Every entry held now was re-stamped under the re-stamp id, its sequence (the write's time) kept.
    for x in net.view:
        store = net.nodes[x].store
        assert store is not None
        assert {version_topology(ver) for _s, _k, ver, _v in store.items()} == {t.restamp}
    assert sum(net.nodes[x].metrics["grid.merge_entries_restamped"] for x in net.view) >= 4
    # A write after the merge beats every re-stamped entry.
    _put(net, net.now + 1.0, b"k1", b"after")
    assert _values(net)[b"k1"] == b"after"


def test_clock_skew_is_the_limit_of_last_writer_wins_across_grids() -> None:
    # Grid B's clocks run 5 s ahead: its write of k1 at virtual time 7 carries time 12, so it beats A's write
    # of k2 at 9 too. The documented limit: across grids that never met, "later" is by the primaries' clocks.
    net, _, _ = _run(skew_b=5.0)
    got = _values(net)
    assert got[b"k1"] == b"b-later"
    assert got[b"k2"] == b"b-earlier"  # acknowledged before A's write, yet it wins: B's clock was ahead


def test_sequences_follow_the_clock_and_stay_above_the_last_and_the_held_one() -> None:
    wall = WALL + 1.25
    c = clock_seq(wall)
    assert c == int(wall * 1000) - 1_704_067_200_000
    assert clock_seq(0.0) == 0  # no wall clock given: sequences count from 1
    assert next_seq(0, 0.0, None) == 1 and next_seq(7, 0.0, None) == 8
    assert next_seq(0, wall, None) == c
    assert next_seq(c + 5, wall, None) == c + 6  # many writes in one millisecond: one above the last
    held = (3 << 40) | (c + 100)  # the key's version from a primary whose clock was ahead
    assert next_seq(0, wall, held) == c + 101
    assert version_seq(held) == c + 100 and version_topology(held) == 3
    assert clock_seq(1e12) <= MAX_SEQ  # far future: bounded, never an invalid version


def test_a_primary_stamps_its_wall_clock_into_the_sequence() -> None:
    net = FakeNet(random.Random(5), CONFIG)
    (x,) = net.add(1)
    node: GridNode = net.nodes[x]
    node.wall_offset = WALL
    net.run_until(2.0)
    op = node.put(b"k", b"v", net.now)
    net.collect(x)
    net.run_until(3.0)
    assert [r.ok for r in net.results[x] if r.op_id == op] == [True]
    store = node.store
    assert store is not None
    ((_s, _k, ver, _v),) = list(store.items())
    assert version_seq(ver) == clock_seq(WALL + 2.0)
    assert version_topology(ver) == node.topology.topology_id  # type: ignore[union-attr]


def test_an_entry_re_stamped_in_the_merge_keeps_its_expiry() -> None:
    """Expiries are recorded per version (docs/grid.md, "Expiry"): the merge re-stamps every entry with a new
    version, and each must keep its expiry through it, or it would never expire."""
    a = _grid(1, 0.0, random.Random(11), 2)
    b = _grid(10, 3.0, random.Random(12), 1)
    b.run_until(9.0)
    x = b.view[-1]
    b.nodes[x].put(b"ttl", b"b", b.now, None, WALL + 40.0)  # expires at virtual time 40, after the merge
    b.collect(x)
    b.run_until(b.now + 0.5)
    _put(a, 9.5, b"plain", b"a")
    net = _merge(a, b)
    t = net.coordinator.topology
    assert t is not None and t.restamp > 0 and net.now < 40.0
    assert _values(net) == {b"ttl": b"b", b"plain": b"a"}
    assert sum(net.nodes[y].metrics["grid.merge_entries_restamped"] for y in net.view) >= 2
    net.run_until(42.0)
    assert _values(net) == {b"plain": b"a"}
    assert sum(net.nodes[y].metrics["grid.entries_expired"] for y in net.view) == 1
