"""Entry expiry (docs/grid.md, "Expiry"): the store's records and the node's removal of expired entries, in a
virtual-time network of nodes (sans-IO, FakeNet from gridnet.py)."""

from __future__ import annotations

import random

import pytest
from groupcluster.grid.consistent_hash import segment_of
from groupcluster.grid.messages import PUT
from groupcluster.grid.node import EXPIRY_RECHECK, GridNode
from groupcluster.grid.store import SegmentStore

from .gridnet import CONFIG, FakeNet, member

# ---- the store ------------------------------------------------------------------------------------------


def test_an_expiry_is_recorded_only_for_the_version_the_key_holds() -> None:
    store = SegmentStore(4)
    store.add_segment(0)
    store.write(0, b"k", 5, b"v")
    store.set_expiry(0, b"k", 4, 100.0)  # an older version: not what the key holds
    assert store.expiry_of(0, b"k", 5) == 0.0 and store.next_expiry() is None
    store.set_expiry(0, b"k", 5, 100.0)
    assert store.expiry_of(0, b"k", 5) == 100.0 and store.next_expiry() == 100.0
    store.set_expiry(0, b"absent", 1, 50.0)
    assert store.next_expiry() == 100.0


def test_due_expiries_skip_entries_written_or_deleted_since() -> None:
    store = SegmentStore(4)
    store.add_segment(0)
    for i, key in enumerate((b"a", b"b", b"c", b"d")):
        store.write(0, key, 10 + i, b"v")
        store.set_expiry(0, key, 10 + i, 100.0 + i)
    store.write(0, b"b", 20, b"newer")  # written again without an expiry: never expires
    store.write(0, b"c", 21, None)  # deleted
    assert store.due_expiries(99.0, 10) == []
    assert store.due_expiries(200.0, 10) == [(0, b"a", 10), (0, b"d", 13)]
    assert store.segments[0].exp.keys() == {b"a", b"d"}  # the stale records went with their heap entries
    assert store.next_expiry() is None
    # A recheck that comes before a later expiry of the same version is not an expiry.
    store.write(0, b"e", 30, b"v")
    store.set_expiry(0, b"e", 30, 300.0)
    store.recheck_expiry(150.0, 0, b"e", 30)
    assert store.due_expiries(160.0, 10) == []
    assert store.due_expiries(300.0, 10) == [(0, b"e", 30)]


def test_due_expiries_take_at_most_the_limit_and_forget_dropped_segments() -> None:
    store = SegmentStore(4)
    store.add_segment(1)
    store.add_segment(2)
    for i in range(5):
        store.write(1, b"k%d" % i, 1, b"v")
        store.set_expiry(1, b"k%d" % i, 1, float(i))
    store.write(2, b"x", 1, b"v")
    store.set_expiry(2, b"x", 1, 0.5)
    store.remove_segment(2)
    assert store.due_expiries(10.0, 3) == [(1, b"k0", 1), (1, b"k1", 1), (1, b"k2", 1)]
    assert store.due_expiries(10.0, 3) == [(1, b"k3", 1), (1, b"k4", 1)]


def test_a_chunk_carries_the_expiries_of_its_entries() -> None:
    src = SegmentStore(4)
    src.add_segment(0)
    assert src.expiries_of(0, [b"a"], [1]) is None  # no expiring entry: no column
    for key, version in ((b"a", 1), (b"b", 2), (b"c", 3)):
        src.write(0, key, version, b"v")
    src.set_expiry(0, b"b", 2, 77.0)
    keys, versions, values = next(src.segment_chunks(0, 10, 1 << 20))
    expiries = src.expiries_of(0, keys, versions)
    assert expiries is not None and dict(zip(keys, expiries, strict=True)) == {b"a": 0.0, b"b": 77.0, b"c": 0.0}
    dst = SegmentStore(4)
    dst.add_segment(0)
    dst.write(0, b"b", 9, b"written during the transfer")  # newer: wins, and does not expire
    dst.apply_chunk(0, keys, versions, values)
    dst.set_expiries(0, keys, versions, expiries)
    assert dst.expiry_of(0, b"b", 9) == 0.0 and dst.next_expiry() is None


# ---- nodes --------------------------------------------------------------------------------------------------


def _grid(members: int, seed: int = 1) -> FakeNet:
    net = FakeNet(random.Random(seed))
    net.add(members)
    net.run_until(3.0)
    assert net.stable()
    return net


def _put(net: FakeNet, key: bytes, value: bytes, lifespan: float) -> None:
    a = net.view[0]
    net.nodes[a].put(key, value, net.now, None, net.now + lifespan)  # FakeNet's wall clock is its virtual time
    net.collect(a)


def _copies(net: FakeNet, key: bytes) -> list[bytes | None]:
    """The value in every live member's store that holds the key's segment (None: absent or a tombstone)."""
    out = []
    for a in net.view:
        store = net.nodes[a].store
        assert store is not None
        seg = segment_of(key, store.num_segments)
        if store.has_segment(seg):
            entry = store.get(seg, key)
            out.append(None if entry is None else entry[1])
    return out


def _primary(net: FakeNet, key: bytes) -> GridNode:
    t = net.coordinator.topology
    assert t is not None
    return net.nodes[t.current.primary_of(segment_of(key, t.num_segments))]


def test_the_primary_removes_an_expired_entry_from_every_copy() -> None:
    net = _grid(3)
    _put(net, b"short", b"v", 2.0)
    _put(net, b"rewritten", b"v", 2.0)
    net.run_until(net.now + 0.5)
    net.nodes[net.view[1]].put(b"rewritten", b"again", net.now)  # no lifespan: this one never expires
    net.collect(net.view[1])
    net.run_until(net.now + 0.5)
    assert _copies(net, b"short") == [b"v", b"v"] and _copies(net, b"rewritten") == [b"again", b"again"]
    net.run_until(net.now + 1.5)
    assert _copies(net, b"short") == [None, None]
    assert _copies(net, b"rewritten") == [b"again", b"again"]
    expired = {a: net.nodes[a].metrics["grid.entries_expired"] for a in net.view}
    assert expired == {a: int(net.nodes[a] is _primary(net, b"short")) for a in net.view}


def test_a_joiner_receives_expiries_by_state_transfer_and_its_copies_expire() -> None:
    net = _grid(2)
    keys = [b"k%d" % i for i in range(60)]
    for k in keys:
        _put(net, k, b"v", 6.0)
    net.run_until(net.now + 0.5)
    (joiner,) = net.add(1)
    net.run_until(net.now + 3.0)
    assert net.stable()
    store = net.nodes[joiner].store
    assert store is not None
    held = [k for k in keys if store.has_segment(segment_of(k, store.num_segments))]
    assert held and all(store.get(segment_of(k, store.num_segments), k) is not None for k in held)
    assert store.next_expiry() is not None  # the expiries came with the entries
    net.run_until(net.now + 4.0)
    assert all(_copies(net, k) == [None, None] for k in keys)
    assert sum(net.nodes[a].metrics["grid.entries_expired"] for a in net.view) == len(keys)


def test_a_backup_removes_what_a_crashed_primary_did_not() -> None:
    net = _grid(3)
    key = b"orphan"
    _put(net, key, b"v", 2.0)
    net.run_until(net.now + 0.5)
    primary = _primary(net, key)
    net.crash(primary.address)
    net.run_until(net.now + 1.0)
    assert net.stable() and _copies(net, key) == [b"v", b"v"]  # not before its time
    net.run_until(net.now + 1.0 + EXPIRY_RECHECK + 1.0)
    assert _copies(net, key) == [None, None]
    assert sum(net.nodes[a].metrics["grid.entries_expired"] for a in net.view) == 1


def test_operations_check_their_expiry() -> None:
    node = GridNode(member(1), CONFIG)  # checked before anything is sent: no network needed
    with pytest.raises(ValueError, match="expires: expected a Unix time"):
        node.put(b"k", b"v", 0.0, None, -1.0)
    with pytest.raises(ValueError, match=r"expiries\[1\]: only a PUT expires"):
        node.start_batch([(PUT, b"a", b"v"), (0, b"b", None)], 0.0, None, [5.0, 5.0])
    with pytest.raises(ValueError, match="expiries: 1 for 2 operations"):
        node.start_batch([(PUT, b"a", b"v"), (PUT, b"b", b"v")], 0.0, None, [5.0])
